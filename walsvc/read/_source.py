"""Where a scanner's messages come from: the backend, or the writer's tail cache.

A ``LogSource`` yields the messages of one pchannel in log order that a filter admits,
from a start policy, reading the tail cache when it holds what comes next and the
backend otherwise:

- it starts in the cache when the cache holds the start position, else in the backend;
- reading the backend, it hands off to the cache as soon as the backend scanner's
  position (everything at or before it returned or rejected) is one the cache covers;
- reading the cache, it falls back to the backend (``start_after`` its position) when
  the entries it needs were evicted.

Every hand-off continues from one position, so nothing is skipped or repeated. On a
writer, a source at the end of the log also yields the writer's idle TimeTicks, once it
has passed the newest message they confirm, while ``idle_ticks`` is on: a source whose
scanner would drop them (``idle_ticks`` off) waits for entries only, so an idle writer's
ticks (every 10 ms) do not wake it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Literal, final

from scanners._tail_cache import TailCache
from walsvc.backends._base import Backend, BackendScanner
from walsvc.core._budget import CACHED_COST, STEP, turn
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALClosed
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage

__all__ = ("LogSource",)


@final
class LogSource:
    """Filtered log messages from the cache or the backend (see the module docstring)."""

    __slots__ = (
        "_backend",
        "_cache",
        "_closed",
        "_fetch",
        "_idle_ticks_ok",
        "_last_tick",
        "_position",
        "_positioned",
        "_scanner",
        "_selected",
        "_slot",
        "_start",
        "_waiter",
        "fallbacks",
        "handoffs",
        "idle_ticks",
    )

    def __init__(
        self,
        backend: Backend,
        cache: TailCache | None,
        deliver: DeliverPolicy,
        selected: Filter,
    ) -> None:
        self._backend = backend
        self._cache = cache
        self._selected = selected
        self._start = deliver  # reopens the backend until a position is known
        self._position: MessageId | None = None  # everything at or before it is behind
        self._positioned = False
        self._scanner: BackendScanner | None = None
        self._slot = 0  # the next cache slot, when reading the cache
        self._fetch: asyncio.Task[Sequence[ImmutableMessage]] | None = None
        self._last_tick = -1
        # Idle ticks are delivered once this source has read something, or started at a
        # position it knows to be read (latest, start_after): never ahead of an error
        # (a truncated start) the backend has yet to report.
        self._idle_ticks_ok = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None  # while waiting on the cache
        #: Whether this source yields idle ticks and waits for them (see ``want_idle_ticks``).
        self.idle_ticks = True
        #: Switches from the backend to the cache, and back (after an eviction).
        self.handoffs = 0
        self.fallbacks = 0
        if deliver.kind in ("latest", "start_after"):
            self._idle_ticks_ok = True
        slot = self._cache_start(deliver)
        if slot is None:
            self._scanner = backend.read(deliver, selected)
        else:
            self._slot = slot
            self._note_reader()

    def _cache_start(self, deliver: DeliverPolicy) -> int | None:
        cache = self._cache
        if cache is None:
            return None
        kind = deliver.kind
        if kind == "latest":
            slot = cache.slot_latest()
            if slot is not None:
                self._position, self._positioned = cache.id_before(slot), True
                self._idle_ticks_ok = True
            return slot
        if kind == "all":
            return cache.slot_after(None)
        assert deliver.message_id is not None
        if kind == "start_after":
            slot = cache.slot_after(deliver.message_id)
            if slot is not None:
                self._position, self._positioned = deliver.message_id, True
                self._idle_ticks_ok = True
            return slot
        return cache.slot_from(deliver.message_id)

    def want_idle_ticks(self, wanted: bool) -> None:
        """Yield idle ticks (and wake for them) or not, from now on: also for a wait on
        the cache in progress, when they become wanted."""
        self.idle_ticks = wanted
        waiter = self._waiter
        if wanted and waiter is not None and self._cache is not None:
            self._cache.want_ticks(waiter)

    @property
    def mode(self) -> Literal["cache", "backend"]:
        """Where the next messages come from."""
        return "backend" if self._scanner is not None else "cache"

    @property
    def position(self) -> MessageId | None:
        """The newest id this source is done with (None before the first). On a
        read-only WAL (no tail cache), the position of a backend scanner that reports
        it, when further: it moves past the records the filter dropped, so a reader
        can tell that it has read as far as an id even when the log ends with records
        it does not deliver (``walsvc tail --no-follow``)."""
        position = self._position
        scanner = self._scanner
        if self._cache is None and scanner is not None and scanner.reports_position:
            ahead = scanner.position()
            if ahead is not None and (position is None or position < ahead):
                return ahead
        return position

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        """The next non-empty batch; waits at the end of the log. Raises ``WALClosed``
        once closed, and what the backend raises (``WALTruncated``, ``CorruptRecord``)."""
        while True:
            if self._closed:
                raise WALClosed("the scanner is closed")
            if self._scanner is not None:
                batch = await self._from_backend(self._scanner)
            else:
                batch = await self._from_cache()
            if batch:
                return batch

    # -- the backend ------------------------------------------------------------------

    async def _from_backend(self, scanner: BackendScanner) -> Sequence[ImmutableMessage]:
        cache = self._cache
        if cache is None:  # a read-only WAL: nothing to hand off to, no idle ticks
            batch = await scanner.next_batch()
            self._advance(batch[-1])
            return batch
        fetch = self._fetch
        if fetch is None:
            fetch = self._fetch = asyncio.ensure_future(scanner.next_batch())
            fetch.add_done_callback(_retrieve)
        while True:
            if fetch.done():
                self._fetch = None
                if fetch.cancelled():  # by a close
                    raise WALClosed("the scanner was closed")
                batch = fetch.result()
                self._advance(batch[-1])
                self._note_scanner_position(scanner)
                return batch
            if self._hand_off(cache, scanner):
                return ()
            tick = self._idle_tick(cache)
            if tick is not None:
                return (tick,)
            waiter = self._waiter = cache.waiter(ticks=self.idle_ticks)
            wake = _waker(waiter)
            fetch.add_done_callback(wake)
            try:
                await waiter
            finally:
                self._waiter = None
                cache.forget_waiter(waiter)
                fetch.remove_done_callback(wake)
            if self._closed:
                raise WALClosed("the scanner was closed")

    def _note_scanner_position(self, scanner: BackendScanner) -> None:
        if scanner.reports_position:
            position = scanner.position()
            if position is not None and (self._position is None or self._position < position):
                self._position = position
            self._positioned = True

    def _hand_off(self, cache: TailCache, scanner: BackendScanner) -> bool:
        """Switch to the cache if it holds everything after this source's position."""
        self._note_scanner_position(scanner)
        if not self._positioned:
            return False
        slot = cache.slot_after(self._position)
        if slot is None:
            return False
        self._scanner, self._slot = None, slot
        self.handoffs += 1
        self._note_reader()
        fetch, self._fetch = self._fetch, None
        _abandon(scanner, fetch)
        return True

    # -- the cache --------------------------------------------------------------------

    async def _from_cache(self) -> Sequence[ImmutableMessage]:
        cache = self._cache
        assert cache is not None
        slot = self._slot
        if cache.evicted_before(slot):
            self._fall_back(cache)
            return ()
        if cache.has_entry(slot):
            # A step at a time, like a decoding reader (see _budget): an entry costs
            # CACHED_COST units, nothing is decoded but the stages after handle it.
            budget = await turn()
            if self._closed or cache.evicted_before(slot):
                return ()  # (next_batch looks again)
            batch, after, last = cache.read(slot, self._selected, STEP // CACHED_COST)
            if after == slot:  # reset meanwhile
                return ()
            budget.spend((after - slot) * CACHED_COST)
            self._slot = after
            self._position, self._positioned = last, True
            self._idle_ticks_ok = True
            self._note_reader()
            if batch:
                self._last_tick = batch[-1].timetick
            return batch
        tick = self._idle_tick(cache)
        if tick is not None:
            return (tick,)
        waiter = self._waiter = cache.waiter(ticks=self.idle_ticks)
        try:
            await waiter
        finally:
            self._waiter = None
            cache.forget_waiter(waiter)
        return ()

    def _fall_back(self, cache: TailCache) -> None:
        """The entries this source needed were evicted: read the backend from here."""
        if self._positioned:
            position = self._position
            deliver = (
                DeliverPolicy.all() if position is None else DeliverPolicy.start_after(position)
            )
        else:
            deliver = self._start
        self._scanner = self._backend.read(deliver, self._selected)
        self.fallbacks += 1
        cache.note_reader(self, None)

    # -- idle ticks, positions ----------------------------------------------------------

    def _idle_tick(self, cache: TailCache) -> ImmutableMessage | None:
        """The writer's newest idle TimeTick, if this source yields them, stands exactly at
        the message it confirms (the newest when it was published: a source past it, one
        that started after a later message, would go back in time) and has not delivered
        a greater tick."""
        tick = cache.idle_tick
        if (
            tick is None
            or not self.idle_ticks
            or not self._idle_ticks_ok
            or tick.timetick <= self._last_tick
            or not self._positioned
            or self._position != tick.message_id
        ):
            return None
        self._last_tick = tick.timetick
        return tick if self._selected.admits(tick) else None

    def _advance(self, last: ImmutableMessage) -> None:
        self._idle_ticks_ok = True
        if last.persisted:
            self._position, self._positioned = last.message_id, True
        self._last_tick = last.timetick

    def _note_reader(self) -> None:
        if self._cache is not None:
            self._cache.note_reader(self, self._slot if self._scanner is None else None)

    async def aclose(self) -> None:
        """Stop; a pending ``next_batch`` raises ``WALClosed``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._cache is not None:
            self._cache.note_reader(self, None)
            self._cache.wake()
        scanner, fetch = self._scanner, self._fetch
        self._scanner = self._fetch = None
        if scanner is not None:
            await scanner.aclose()
            if fetch is not None and not fetch.done():
                # The backend scanner's close should end the fetch (with WALClosed); do
                # not count on it.
                fetch.cancel()
                await asyncio.gather(fetch, return_exceptions=True)


def _abandon(
    scanner: BackendScanner, fetch: asyncio.Task[Sequence[ImmutableMessage]] | None
) -> None:
    """Close a backend scanner the source no longer reads, in the background: whatever
    its pending fetch returns lies after the hand-off position and is read from the
    cache."""

    async def close() -> None:
        await scanner.aclose()
        if fetch is not None and not fetch.done():
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)

    task = asyncio.ensure_future(close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set[asyncio.Future[None]] = set()


def _retrieve(fetch: asyncio.Future[Sequence[ImmutableMessage]]) -> None:
    """Mark a fetch's error as seen: a source closed while fetching may never ask."""
    if not fetch.cancelled():
        fetch.exception()


def _waker(waiter: asyncio.Future[None]) -> Callable[[object], None]:
    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    return wake
