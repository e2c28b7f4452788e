"""A writer's producer, replaced when pulsar-client has given up on it.

pulsar-client 3.12 (its C++ client 4.1.0) arms a start timeout of ``operation_timeout``
when it creates a producer. If the producer loses its broker shortly before that timeout
fires, the timeout cancels the reconnection the producer had scheduled, and nothing
schedules another: the producer stays disconnected for good (its log says "Cancel the
pending reconnection due to the start timeout"). A WAL so stuck answered every append
with ``BackendUnavailable`` for minutes after its broker came back (3 runs in 62 of one
seed of the fault schedule).

Such a producer cannot be told apart from one still reconnecting, so ``ProducerKeeper``
replaces a producer it has seen disconnected for longer than ``stuck_after`` seconds: it
makes a new one, then closes the old one. Replacing a producer that was only slow costs
a creation and nothing else: what the old one still held fails when it closes, and the
writer's chain (``_writer``) settles what a failed group left in the log. A replacement
asks for ``Exclusive`` access, never ``ExclusiveWithFencing``: it must not take the
topic from a newer writer. A refusal (``WALFenced``: the broker may still hold the old
producer) is the writer's to judge against the log: fenced only if a newer writer's
barrier is there (``GroupWriter._live_producer``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, final

from walsvc.core._errors import BackendUnavailable, WALClosed

from ._log import STOP_WITHIN, close_quietly

if TYPE_CHECKING:
    import pulsar.asyncio as pulsar_asyncio

__all__ = ("ProducerKeeper",)


@final
class ProducerKeeper:
    """The producer of one writer (see the module's docstring): ``producer`` for the
    calls that need no connection, ``connected()`` for sends. ``make()`` makes a
    replacement (and raises what a failed creation raises)."""

    __slots__ = ("_make", "_producer", "_since", "_stuck_after", "_topic", "replaced")

    def __init__(
        self,
        producer: pulsar_asyncio.Producer,
        make: Callable[[], Awaitable[pulsar_asyncio.Producer]],
        topic: str,
        stuck_after: float,
    ) -> None:
        #: None once closed.
        self._producer: pulsar_asyncio.Producer | None = producer
        self._make = make
        self._topic = topic
        self._stuck_after = stuck_after
        #: When the producer was first seen disconnected (None: connected when last seen).
        self._since: float | None = None
        #: How many producers were replaced (for stats and tests).
        self.replaced = 0

    @property
    def producer(self) -> pulsar_asyncio.Producer:
        """The producer; ``WALClosed`` once the keeper is closed."""
        if self._producer is None:
            raise WALClosed(f"pulsar WAL of {self._topic} was closed")
        return self._producer

    async def connected(self) -> pulsar_asyncio.Producer:
        """The producer, connected to its broker. ``BackendUnavailable`` (nothing was
        sent) while it is not; one seen disconnected for longer than ``stuck_after``
        seconds is replaced first, and the new one returned if it is connected."""
        producer = self.producer
        if producer.is_connected():
            self._since = None
            return producer
        now = time.monotonic()
        if self._since is None:
            self._since = now
        elif now - self._since >= self._stuck_after:
            self._since = None  # a failed replacement waits as long before the next
            producer = await self._replace(producer)
            if producer.is_connected():
                return producer
        raise BackendUnavailable(
            f"pulsar WAL of {self._topic}: the producer is not connected to the broker"
        )

    async def _replace(self, old: pulsar_asyncio.Producer) -> pulsar_asyncio.Producer:
        new = await self._make()
        if self._producer is not old:  # closed (or replaced) meanwhile
            await close_quietly(new, STOP_WITHIN)
            return self.producer
        self._producer = new
        self.replaced += 1
        await close_quietly(old, STOP_WITHIN)
        return new

    async def aclose(self) -> None:
        """Close the producer (within ``STOP_WITHIN`` seconds) and let go of it. Never
        raises; idempotent."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_quietly(producer, STOP_WITHIN)
