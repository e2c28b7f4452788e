"""Reading a topic's messages in log order, without the client's asynchronous receive.

pulsar-client's ``read_next_async`` (what ``pulsar.asyncio.Reader.read_next`` awaits)
can hand out a message ahead of the one queued just before it. When a message arrives,
the C++ consumer first checks, under a lock, whether an asynchronous receive is waiting,
and only after releasing that lock puts the message in its receiver queue
(``ConsumerImpl::executeNotifyCallback``, pulsar-client-cpp). A receive registered in
between finds the queue empty and waits for the *next* message, while this one sits in
the queue: the reader sees N+1 before N, and at the end of a topic it does not see N at
all until some later message arrives. walsvc drops an id below the last one as a
re-delivery, so N would be lost to the scan (seen once in about 15 runs of the Pulsar
conformance test, with a scanner that keeps up with its writer).

``OrderedReader`` never registers an asynchronous receive. It pops the receiver queue
synchronously, on the event loop only: what is already queued (about 2 us a message, the
GIL released), and, when the queue is empty, again after a short sleep that grows while
the reader stays quiet (1, 2, 5, 10, then 20 ms). Messages then leave in exactly the
order the client's I/O thread queued them.

No pop ever runs on a thread of walsvc's own. Blocking pops in worker threads (walsvc
until 2026-11-30) ran inside pulsar-client while the event loop's thread made other calls
into it (a close, a creation, a subscription), and processes crashed with a corrupted
heap now and then: SIGABRT or SIGSEGV in ``make test`` while the machine was loaded, at
most a few times in a hundred runs of the Pulsar modules and never with a
reproducible culprit. A close that waited for the pop cut that rate but did not end it.
Polling costs a quiet reader 50 wake-ups a second of a few microseconds each, and a
message that arrives while its reader is quiet waits up to 20 ms more.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, final

import pulsar
import pulsar.asyncio as pulsar_asyncio

from walsvc.core._errors import WALClosed

from ._client import PULSAR_ERRORS, call_async, translate
from ._creations import Creations
from ._ids import PulsarMessageId

__all__ = ("OrderedReader", "redeliveries_dropped")

#: The most messages one ``next_batch`` returns (the readers' receiver queue size).
BATCH: Final = 1000
#: How long a reader whose queue is empty sleeps before it pops again, one after
#: another while it stays quiet (seconds); the last is the most a message that arrives
#: meanwhile waits for it.
_QUIET_SLEEPS: Final = (0.001, 0.002, 0.005, 0.01, 0.02)

#: Messages a reader delivered again (ids not above the previous one) and that were
#: dropped; Pulsar Lite re-sends ranges of entries to a reader now and then.
redeliveries_dropped = 0


def _pop_queued(raw: Any, limit: int) -> list[Any]:
    """Up to ``limit`` messages the C reader ``raw`` already holds, without waiting."""
    out: list[Any] = []
    while len(out) < limit:
        try:
            out.append(raw.read_next(0))
        except pulsar.Timeout:
            break
    return out


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark the outcome of a close nobody awaits any more as seen."""
    if not future.cancelled():
        future.exception()


@final
class OrderedReader:
    """The messages of one ``pulsar.asyncio.Reader``, each once, in strictly increasing
    id order (a message delivered again, at or below the last id returned, is dropped).
    One task reads it at a time.

    ``start`` and ``inclusive`` record where the reader was created (an id, or the
    names ``"earliest"`` / ``"latest"``; None if unknown) so that a replacement can
    resume where it left off (``_log.reopen``). ``creations``, those of the reader's
    client, see its close through before the client closes (None: nobody waits)."""

    __slots__ = (
        "_closing",
        "_creations",
        "_last",
        "_quiet",
        "_raw",
        "_reader",
        "inclusive",
        "start",
    )

    def __init__(
        self,
        reader: pulsar_asyncio.Reader,
        *,
        start: PulsarMessageId | str | None = None,
        inclusive: bool = False,
        creations: Creations | None = None,
    ) -> None:
        self._reader = reader
        self.start = start
        self.inclusive = inclusive
        self._raw: Any = reader._reader  # the C reader under pulsar.asyncio's
        self._last: PulsarMessageId | None = None
        #: Pops that found the queue empty since the last message (the index in
        #: _QUIET_SLEEPS).
        self._quiet = 0
        self._creations = creations
        self._closing: asyncio.Future[None] | None = None

    def topic(self) -> str:
        """The topic read."""
        return str(self._reader.topic())

    @property
    def last(self) -> PulsarMessageId | None:
        """The id of the last message ``next_batch`` returned (None before the first)."""
        return self._last

    async def next_batch(self) -> list[tuple[PulsarMessageId, Any]]:
        """The next messages (at most ``BATCH``) with their ids: every message already
        queued, or, when none is, those queued by the first pop that finds some. Empty
        only if every message that came was a re-delivery (so a caller reading to a
        bound can look at ``has_message_available`` again). Pulsar errors are translated
        (``WALClosed`` once the reader is closed or closing). Cancelling it loses no
        message: nothing is popped while it sleeps."""
        while True:
            if self._closing is not None:
                raise WALClosed(f"the reader of {self.topic()} is closed")
            try:
                messages = _pop_queued(self._raw, BATCH)
            except PULSAR_ERRORS as exc:
                raise translate(exc, f"reading {self.topic()} failed") from exc
            if messages:
                self._quiet = 0
                return self._fresh(messages)
            await asyncio.sleep(_QUIET_SLEEPS[min(self._quiet, len(_QUIET_SLEEPS) - 1)])
            self._quiet += 1

    def _fresh(self, messages: list[Any]) -> list[tuple[PulsarMessageId, Any]]:
        global redeliveries_dropped
        last = self._last
        out: list[tuple[PulsarMessageId, Any]] = []
        for message in messages:
            message_id = PulsarMessageId.of(message.message_id())
            if last is not None and message_id <= last:
                redeliveries_dropped += 1
                continue
            out.append((message_id, message))
            last = message_id
        self._last = last
        return out

    async def has_message_available(self) -> bool:
        """Whether the topic holds a message after the last one ``next_batch`` returned
        (queued in the reader, or, if none is, on the broker: the client asks it).
        Pulsar errors are translated."""
        try:
            return bool(await call_async(self._raw.has_message_available_async))
        except PULSAR_ERRORS as exc:
            raise translate(exc, f"reading {self.topic()} failed") from exc

    async def owes_messages(self) -> bool:
        """Whether the topic holds a message after the last one ``next_batch`` returned
        that this reader has yet to return (for a reader that has been quiet):
        ``has_message_available``. Pulsar errors are translated."""
        return await self.has_message_available()

    async def close(self) -> None:
        """Close the reader. A caller cancelled or timed out meanwhile does not stop the
        close: it goes on, and the client's close waits for it
        (``Creations.see_through``). Idempotent: a second call awaits the first's
        close."""
        if self._closing is None:
            closing = call_async(self._raw.close_async)
            if self._creations is not None:
                self._closing = self._creations.see_through(_closed(closing))
            else:
                self._closing = closing
                closing.add_done_callback(_retrieve)
        await asyncio.shield(self._closing)


async def _closed(closing: asyncio.Future[Any]) -> None:
    await closing
