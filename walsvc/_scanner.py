"""The scanner users iterate: messages of one pchannel in log order, filtered; on a
writer, interleaved with the idle TimeTicks the timetick sync does not persist."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import final

from ._errors import WALClosed
from ._filter import Filter
from ._ids import MessageId
from ._message import ImmutableMessage
from .backends import BackendScanner

__all__ = ("IdleTicks", "Scanner")


@final
class IdleTicks:
    """The newest idle (not persisted) TimeTick of one writer, and the scanners waiting
    for one. An idle tick is published only when nothing is in flight, so its
    ``message_id`` is the newest message in the log: a scanner that has delivered that
    message has seen everything below the tick."""

    __slots__ = ("latest", "waiters")

    def __init__(self) -> None:
        self.latest: ImmutableMessage | None = None
        self.waiters: set[asyncio.Future[None]] = set()

    def publish(self, tick: ImmutableMessage) -> None:
        """Make ``tick`` the newest idle tick and wake the waiting scanners."""
        self.latest = tick
        waiters, self.waiters = self.waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def has_waiters(self) -> bool:
        """True if a scanner is waiting at the end of the log."""
        return bool(self.waiters)


@final
class Scanner:
    """Messages in log order, as an async iterator and async context manager.

    Iteration waits for new messages at the end of the log; it ends only when this scanner
    is closed with ``aclose()``. If the WAL is closed underneath it, iteration raises
    ``WALClosed`` instead, so a reader never mistakes a shutdown for the end of the log.
    """

    __slots__ = (
        "_backend_scanner",
        "_batch",
        "_fetch",
        "_idle_ticks",
        "_index",
        "_last_id",
        "_last_tick",
        "_on_close",
        "_selected",
        "_user_closed",
        "_wal_closed",
    )

    def __init__(
        self,
        backend_scanner: BackendScanner,
        on_close: Callable[[Scanner], None],
        *,
        idle_ticks: IdleTicks | None = None,
        selected: Filter | None = None,
        caught_up_to: MessageId | None = None,
    ) -> None:
        self._backend_scanner = backend_scanner
        self._on_close = on_close
        self._batch: Sequence[ImmutableMessage] = ()
        self._index = 0
        self._user_closed = False
        self._wal_closed = False
        self._idle_ticks = idle_ticks
        self._selected = selected if selected is not None else Filter.everything()
        self._fetch: asyncio.Task[Sequence[ImmutableMessage]] | None = None
        self._last_id = caught_up_to
        self._last_tick = -1

    def __aiter__(self) -> Scanner:
        return self

    async def __anext__(self) -> ImmutableMessage:
        index = self._index
        batch = self._batch
        if index < len(batch):
            self._index = index + 1
            return batch[index]
        batch = await self._next_batch()
        self._batch = batch
        self._index = 1
        return batch[0]

    async def batches(self) -> AsyncIterator[Sequence[ImmutableMessage]]:
        """Iterate in batches (each non-empty) instead of one message at a time."""
        if self._index < len(self._batch):
            rest = self._batch[self._index :]
            self._batch, self._index = (), 0
            yield rest
        while True:
            try:
                yield await self._next_batch()
            except StopAsyncIteration:
                return

    async def _next_batch(self) -> Sequence[ImmutableMessage]:
        if self._user_closed:
            raise StopAsyncIteration
        if self._wal_closed:
            raise WALClosed("the WAL of this scanner is closed")
        try:
            if self._idle_ticks is None:
                return await self._backend_scanner.next_batch()
            batch = await self._next_batch_or_idle_tick(self._idle_ticks)
        except WALClosed:
            if self._user_closed:
                raise StopAsyncIteration from None
            raise
        last = batch[-1]
        if last.persisted:
            self._last_id = last.message_id
        self._last_tick = last.timetick
        return batch

    async def _next_batch_or_idle_tick(self, idle_ticks: IdleTicks) -> Sequence[ImmutableMessage]:
        """The backend's next batch, or an idle tick if one comes first while this scanner
        has delivered everything below it."""
        fetch = self._fetch
        if fetch is None:
            fetch = self._fetch = asyncio.ensure_future(self._backend_scanner.next_batch())
            fetch.add_done_callback(_retrieve)
        loop = asyncio.get_running_loop()
        while True:
            if fetch.done():
                self._fetch = None
                if fetch.cancelled():  # by a close of this scanner
                    raise WALClosed("the scanner was closed")
                return fetch.result()
            tick = idle_ticks.latest
            if (
                tick is not None
                and tick.timetick > self._last_tick
                and self._last_id is not None
                and self._last_id >= tick.message_id
            ):
                self._last_tick = tick.timetick
                if self._selected.admits(tick):
                    return (tick,)
            waiter: asyncio.Future[None] = loop.create_future()
            wake = _waker(waiter)
            fetch.add_done_callback(wake)
            idle_ticks.waiters.add(waiter)
            try:
                await waiter
            finally:
                idle_ticks.waiters.discard(waiter)
                fetch.remove_done_callback(wake)

    async def aclose(self) -> None:
        """Stop the scanner; iteration then ends. Idempotent."""
        if self._user_closed:
            return
        self._user_closed = True
        self._batch, self._index = (), 0  # nothing buffered is delivered after close
        self._on_close(self)
        await self._close_backend_scanner()

    async def _close_for_wal(self) -> None:
        """Close because the WAL closed: pending and later reads raise ``WALClosed``."""
        self._wal_closed = True
        self._batch, self._index = (), 0
        await self._close_backend_scanner()

    async def _close_backend_scanner(self) -> None:
        await self._backend_scanner.aclose()
        fetch = self._fetch
        if fetch is not None and not fetch.done():
            # The backend scanner's close should end the fetch (with WALClosed); do not
            # count on it.
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)

    async def __aenter__(self) -> Scanner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _retrieve(fetch: asyncio.Future[Sequence[ImmutableMessage]]) -> None:
    """Mark a fetch's error as seen: a scanner closed while fetching may never ask."""
    if not fetch.cancelled():
        fetch.exception()


def _waker(waiter: asyncio.Future[None]) -> Callable[[object], None]:
    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    return wake
