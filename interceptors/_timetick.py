"""Timetick sync: every ``interval`` (10 ms by default) a WAL either persists a TimeTick
(if anything was appended since the last persisted one) or publishes an idle tick that
only its tailing scanners and tick listeners see.

While appends keep coming the TimeTick waits: the timer persists it once a visit finds
nothing appended since the one before (the burst is over), or once ``MAX_DEFERRALS``
visits have passed (0.1 s by default) under a steady stream. A producer that appends
every interval would otherwise write a TimeTick frame (and, with ``sync="always"``, an
fsync) after every message: 244 log bytes per 100-byte message instead of 180 on
``file://``, read again by every tailing reader. Each data message carries its own tick;
the TimeTick is what tells readers of other vchannels that time moved, and they learn it
at most 0.1 s late under load.

Ticks themselves are assigned at the WAL's serialization point, not here: that is what
makes log order equal tick order. This interceptor only decides when a TimeTick is worth
writing. One timer per event loop and interval drives the sync of every WAL that has
something to do; a WAL with nothing appended since its last TimeTick and nobody waiting
for idle ticks is quiet: the timer leaves it alone until the WAL wakes it
(``InterceptorContext.wake_on_activity``: an append, a tick listener, a scanner waiting
for ticks), and stops when every WAL is quiet. Idle pchannels cost nothing per interval.

A TimeTick that fails because the backend is away for now (``transient``) is tried again
after a wait that doubles with each failure, up to 1 s; one that fails for good (the WAL
was fenced or closed) stops the sync, and the appends report why.
"""

from __future__ import annotations

import asyncio
import math
from typing import Final, final

from walsvc.core._chain import InterceptorContext
from walsvc.core._errors import WALError, transient
from walsvc.core._message import Message, MessageType

__all__ = ("DEFAULT_SYNC_INTERVAL", "MAX_DEFERRALS", "TimetickSync")

#: Seconds between timetick syncs (Milvus: 0.2).
DEFAULT_SYNC_INTERVAL: Final = 0.010
#: Timer visits a TimeTick waits for a burst of appends to end before it is persisted
#: anyway (0.1 s at the default interval).
MAX_DEFERRALS: Final = 9
#: Timer visits the sync waits at most after a TimeTick failed transiently before it tries
#: again (1 s at the default interval): the wait doubles from 1 with each failure in a row.
MAX_BACKOFF_VISITS: Final = 100
_TIME_TICK: Final = Message(payload=b"", vchannel="", type=MessageType.TIME_TICK)


@final
class TimetickSync:
    """Persists a TimeTick after appends and publishes idle ticks in between.

    ``interval`` is in seconds; None means no timer: the owner drives the sync by calling
    ``sync_once()`` (tests with an injected clock do). A TimeTick T promises readers that
    every message with a tick <= T is durable and that no later message has a tick <= T.
    """

    __slots__ = (
        "_backoff",
        "_context",
        "_deferrals",
        "_interval",
        "_loop",
        "_persisted_tick",
        "_persisting",
        "_quiet",
        "_seen_tick",
        "_skipped",
        "_stopped",
    )

    def __init__(self, interval: float | None = DEFAULT_SYNC_INTERVAL) -> None:
        if interval is not None and (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise ValueError(f"interval must be None or seconds > 0, not {interval!r}")
        self._interval = interval
        self._context: InterceptorContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._persisted_tick = 0
        # The newest data tick the timer saw at its last visit, and how many visits in a
        # row found appends since the one before (the TimeTick waited).
        self._seen_tick = 0
        self._deferrals = 0
        self._persisting: asyncio.Task[None] | None = None
        # After a TimeTick failed transiently: the visits to wait before the next try
        # (doubling with each failure in a row), and how many of them are left.
        self._backoff = 0
        self._skipped = 0
        self._quiet = False  # the timer leaves this WAL alone until it wakes us
        self._stopped = False

    @property
    def interval(self) -> float | None:
        """Seconds between syncs, or None when driven by ``sync_once``."""
        return self._interval

    async def ready(self, context: InterceptorContext) -> None:
        """Bind to the WAL and append the opening TimeTick straight to the backend: it is
        this writer's first record, seeds the last-confirmed id and (on backends that
        fence by writing) fences older writers."""
        if self._context is not None and self._context is not context:
            raise RuntimeError("a TimetickSync serves one WAL; build one per open_wal")
        self._context = context
        result = await context.append_system(_TIME_TICK)
        self._persisted_tick = result.timetick
        if self._interval is not None and not self._stopped:
            self._loop = asyncio.get_running_loop()
            _ticker(self._loop, self._interval).add(self)  # its first visit decides

    async def sync_once(self) -> int | None:
        """Sync now: persist a TimeTick if anything was appended since the last one, else
        publish an idle tick if someone listens. Returns the tick, or None if neither."""
        context = self._bound()
        if context.data_tick() > self._persisted_tick:
            return await self._persist(context)
        if context.has_tick_listeners():
            return context.publish_idle_tick()
        return None

    def _on_timer(self) -> bool:
        """The shared timer's visit: what ``sync_once`` does, without waiting. False if
        the WAL is quiet (or gone): the timer leaves it alone until ``_wake``."""
        context = self._context
        if context is None or self._stopped:
            return False
        if self._persisting is not None:
            return True
        if context.closed:
            self._leave()
            return False
        if self._skipped:  # a TimeTick failed transiently: back off
            self._skipped -= 1
            return True
        data_tick = context.data_tick()
        if data_tick > self._persisted_tick:
            if data_tick > self._seen_tick and self._deferrals < MAX_DEFERRALS:
                self._seen_tick = data_tick  # still appending: wait for the burst to end
                self._deferrals += 1
                return True
            self._deferrals = 0
            self._persisting = asyncio.ensure_future(self._persist_in_background(context))
        elif context.has_tick_listeners():
            context.publish_idle_tick()
        else:
            self._quiet = True
            context.wake_on_activity(self._wake)
            return False
        return True

    def _wake(self) -> None:
        """The WAL's wake-up (something appended, or someone wants idle ticks): back to
        the timer, whose next visit (within one interval) looks."""
        if not self._quiet:
            return
        self._quiet = False
        context, loop, interval = self._context, self._loop, self._interval
        assert context is not None
        context.wake_on_activity(None)
        if self._stopped or loop is None or interval is None or loop.is_closed():
            return
        _ticker(loop, interval).add(self)

    async def _persist(self, context: InterceptorContext) -> int:
        result = await context.append_system(_TIME_TICK)
        self._persisted_tick = max(self._persisted_tick, result.timetick)
        context.notify_tick(result.timetick)
        return result.timetick

    async def _persist_in_background(self, context: InterceptorContext) -> None:
        try:
            await self._persist(context)
            self._backoff = 0
        except WALError as exc:
            if not transient(exc):
                # Fenced, closed or broken: the appends report it; the sync stops.
                self._leave()
            else:  # the backend is away for now: a later visit tries again
                self._backoff = min(2 * self._backoff or 1, MAX_BACKOFF_VISITS)
                self._skipped = self._backoff
        finally:
            self._persisting = None

    def _bound(self) -> InterceptorContext:
        if self._context is None:
            raise RuntimeError("TimetickSync is not bound to a WAL yet")
        return self._context

    def _leave(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._quiet:
            self._quiet = False
            assert self._context is not None
            self._context.wake_on_activity(None)
        if self._loop is not None and self._interval is not None:
            ticker = _tickers.get((self._loop, self._interval))
            if ticker is not None:
                ticker.members.discard(self)

    async def aclose(self) -> None:
        """Stop syncing and wait for a TimeTick being written."""
        if self._context is not None:
            self._leave()
        else:
            self._stopped = True  # closed before ready got to the timer
        persisting = self._persisting
        if persisting is not None:
            await asyncio.gather(persisting, return_exceptions=True)


@final
class _Ticker:
    """One repeating timer per (event loop, interval), visiting its members: the syncs
    that are not quiet. It stops when none is left (``_ticker`` then makes a new one)."""

    __slots__ = ("handle", "interval", "loop", "members", "visits")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.members: set[TimetickSync] = set()
        self.handle: asyncio.TimerHandle | None = None
        #: Syncs visited (tests count them).
        self.visits = 0

    def add(self, member: TimetickSync) -> None:
        """Visit ``member`` from the next interval on (starting the timer if stopped)."""
        self.members.add(member)
        if self.handle is None:
            self.handle = self.loop.call_later(self.interval, self.fire)

    def fire(self) -> None:
        self.handle = None
        members = list(self.members)
        self.visits += len(members)
        for member in members:
            if not member._on_timer():
                self.members.discard(member)
        # A member woken meanwhile restarted the timer through add.
        if not self.members or self.loop.is_closed():
            self.members.clear()
            if _tickers.get((self.loop, self.interval)) is self:
                del _tickers[(self.loop, self.interval)]
        elif self.handle is None:
            self.handle = self.loop.call_later(self.interval, self.fire)


_tickers: dict[tuple[asyncio.AbstractEventLoop, float], _Ticker] = {}


def _ticker(loop: asyncio.AbstractEventLoop, interval: float) -> _Ticker:
    ticker = _tickers.get((loop, interval))
    if ticker is None:
        ticker = _tickers[(loop, interval)] = _Ticker(loop, interval)
    return ticker
