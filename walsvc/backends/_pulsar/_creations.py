"""Creations in flight on one pulsar-client client, seen through to their end.

The C++ client goes on creating a reader, consumer or producer after the asyncio caller
that asked for it was cancelled or timed out, and it leaks what a close of the client
overtakes: a creation in flight then keeps a reconnection timer, its connection and the
client's I/O context alive, with their threads. Measured with Pulsar Lite: a WAL closed
while a read was still creating its reader left one native thread and six descriptors
behind in 4 of 8 closes.

So every creation of a WAL's goes through its lease's ``Creations.make`` (``_clients``:
the WALs of a process share a client): the creation runs to its end whatever happens to
its caller; what a cancelled caller will never receive is closed (disposed of) when it
arrives; and ``Creations.aclose``, which the backend awaits before it stops using the
client, refuses new creations and waits for those in flight. Other work that
must end first (a reader's close, which waits for a pop in a worker thread first) goes
through ``Creations.see_through``.

A creation's caller waits a bounded time (``Creations(within=...)``): pulsar-client's
synchronous ``create_reader`` was seen never to return when its client closed right after
a broker restart (docs/pulsar-heap-corruption.md), and its operation timeout does not
cover that. The caller then gets ``BackendUnavailable``; the creation goes on as for a
cancelled caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar, final

from walsvc.core._errors import BackendUnavailable, WALClosed

__all__ = ("DISPOSE_WITHIN", "Creations")

_T = TypeVar("_T")

#: Seconds the disposal of a creation nobody received may take (a broker that does not
#: answer would hold it for the operation timeout).
DISPOSE_WITHIN: Final = 1.0


@final
class Creations:
    """The creations in flight on one client (see the module's docstring)."""

    __slots__ = ("_closing", "_in_flight", "_what", "_within")

    def __init__(self, what: str, within: float) -> None:
        #: What the client serves, for the errors of a creation.
        self._what = what
        #: Seconds a caller of ``make`` waits for its creation at most.
        self._within = within
        self._closing = False
        #: Creations not yet ended, and disposals of what cancelled callers left.
        self._in_flight: set[asyncio.Future[Any]] = set()

    @property
    def in_flight(self) -> int:
        """How many creations (and disposals) have yet to end."""
        return len(self._in_flight)

    async def make(
        self,
        create: Coroutine[Any, Any, _T],
        dispose: Callable[[_T], Awaitable[None]] | None = None,
    ) -> _T:
        """What ``create`` makes. If the caller is cancelled (or times out) first, the
        creation still runs to its end and what it makes is handed to ``dispose``
        (errors ignored, within ``DISPOSE_WITHIN`` seconds). A creation that has not ended
        within the bound given to ``Creations`` is left so too, and the caller gets
        ``BackendUnavailable``. ``WALClosed`` once ``aclose`` was called (``create`` is
        then not started)."""
        if self._closing:
            create.close()
            raise WALClosed(f"{self._what} is closed")
        creation = asyncio.ensure_future(create)
        self._track(creation)
        try:  # asyncio.wait never cancels the creation
            ended, _ = await asyncio.wait((creation,), timeout=self._within)
        except asyncio.CancelledError:
            self._leave(creation, dispose)
            raise
        if not ended:
            self._leave(creation, dispose)
            raise BackendUnavailable(
                f"{self._what} did not finish creating a reader, consumer or producer"
                f" within {self._within} s"
            )
        return creation.result()

    def _leave(
        self, creation: asyncio.Future[_T], dispose: Callable[[_T], Awaitable[None]] | None
    ) -> None:
        """Have what ``creation`` makes disposed of: its caller has gone."""
        if dispose is not None:
            self._track(asyncio.ensure_future(_dispose_when_made(creation, dispose)))

    def see_through(self, work: Coroutine[Any, Any, _T]) -> asyncio.Future[_T]:
        """Run ``work`` to its end, whatever happens to whoever awaits the returned
        future (await it through ``asyncio.shield``); ``aclose`` waits for it, even when
        it started after ``aclose`` did."""
        future = asyncio.ensure_future(work)
        self._track(future)
        return future

    def _track(self, future: asyncio.Future[Any]) -> None:
        self._in_flight.add(future)
        future.add_done_callback(self._ended)

    def _ended(self, future: asyncio.Future[Any]) -> None:
        self._in_flight.discard(future)
        if not future.cancelled():
            future.exception()  # retrieved: the caller may be gone

    async def aclose(self, within: float) -> None:
        """Refuse new creations, then wait up to ``within`` seconds for those in flight
        (and the disposals they lead to) to end. Never raises; may be called again."""
        self._closing = True
        deadline = time.monotonic() + within
        while self._in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.wait(set(self._in_flight), timeout=left)


async def _dispose_when_made(
    creation: asyncio.Future[_T], dispose: Callable[[_T], Awaitable[None]]
) -> None:
    await asyncio.wait((creation,))  # never cancels the creation
    if creation.cancelled() or creation.exception() is not None:
        return
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DISPOSE_WITHIN):
            await dispose(creation.result())
