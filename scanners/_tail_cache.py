"""The write-ahead tail cache: the newest messages of one writer's log, in memory, shared
by every scanner of that WAL (Milvus's write-ahead buffer, without its slow catch-up).

The WAL reserves slots at its serialization point (log order) and ``put``s each message,
already an ``ImmutableMessage``, once the backend acknowledged it; scanners read only
acknowledged messages, so a reader never sees an append before it is durable. Messages
are shared, not copied: one object serves every reader.

The cache keeps entries only while some scanner is open (``activate``/``deactivate``),
so appends with nobody reading cost two counter updates. It holds every message with an
id greater than ``floor`` (when the floor is known), bounded by ``max_bytes`` (payload
and vchannel bytes plus a fixed per-entry estimate of the Python objects) and by
``max_age`` (an entry goes once it is that much older, in timetick milliseconds, than the
newest). Eviction never waits for slow readers: a reader that falls behind the floor
reads the backend instead, so memory stays bounded whatever the readers do.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Sequence
from typing import Final, final

import msgspec

from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage
from walsvc.core._timetick import span_of_ms

__all__ = ("CacheStats", "TailCache")

#: Bytes a cached entry costs beyond its payload and vchannel (the ImmutableMessage, its
#: id and the list slot), measured with tracemalloc: benchmarks/bench_scanners.py
#: (TailCacheMemory) measured 245 bytes per entry.
ENTRY_OVERHEAD: Final = 240
_COMPACT_AT: Final = 4096
_BATCH: Final = 1024


class CacheStats(msgspec.Struct, frozen=True):
    """A snapshot of a WAL's tail cache.

    ``pressure`` is, over the scanners reading from the cache, the largest share of the
    cached messages still ahead of a scanner (0: every reader is at the head; 1: a reader
    is at the oldest entry and the next eviction sends it to the backend).
    """

    active: bool
    messages: int
    bytes: int
    max_bytes: int
    max_age: float
    oldest_id: MessageId | None
    newest_id: MessageId | None
    readers: int
    pressure: float
    evicted: int
    resets: int


def _size(message: ImmutableMessage) -> int:
    return len(message.payload) + len(message.vchannel) + ENTRY_OVERHEAD


@final
class TailCache:
    """The tail of one writer's log (see the module docstring for the promises)."""

    __slots__ = (
        "_active",
        "_bytes",
        "_durable_end",
        "_floor",
        "_floor_known",
        "_head",
        "_head_tick",
        "_items",
        "_lost_since_put",
        "_max_age_ticks",
        "_parked",
        "_pending",
        "_readers",
        "_reserved",
        "_start",
        "_tick_waiters",
        "_waiters",
        "evicted",
        "idle_tick",
        "max_age",
        "max_bytes",
        "on_activity",
        "resets",
    )

    def __init__(self, *, max_bytes: int, max_age: float) -> None:
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._max_age_ticks = span_of_ms(max(0, round(max_age * 1000)))
        self._active = False
        self._items: list[ImmutableMessage] = []
        self._start = 0  # slot number of _items[0]
        self._head = 0  # slot number of the oldest retained entry
        self._durable_end = 0  # slot number after the newest entry put
        self._reserved = 0  # slot number the next reservation gets
        self._pending = 0  # appends reserved and not yet acknowledged or lost
        self._parked: dict[int, Sequence[ImmutableMessage]] = {}
        self._bytes = 0
        self._head_tick = 0
        self._floor: MessageId | None = None
        self._floor_known = False
        # An append failed (it may or may not be in the log) and no entry was put since:
        # the writer's newest acknowledged id may be older than the log's newest, so it
        # cannot be the floor of an activation (see ``activate``).
        self._lost_since_put = False
        # Scanners waiting for the next entry (woken by puts, resets, truncation, close),
        # and those of them that also want idle ticks (woken by those too).
        self._waiters: set[asyncio.Future[None]] = set()
        self._tick_waiters: set[asyncio.Future[None]] = set()
        self._readers: dict[object, int] = {}
        #: The newest idle (not persisted) TimeTick of the writer.
        self.idle_tick: ImmutableMessage | None = None
        #: Entries evicted by the byte and age bounds (truncation not counted).
        self.evicted = 0
        #: Times the cache lost its coverage (a failed append, or a restart after idling).
        self.resets = 0
        #: Called while set when a scanner starts waiting for idle ticks (the timetick
        #: sync's wake-up for an idle WAL: ``WALContext.wake_on_activity``).
        self.on_activity: Callable[[], object] | None = None

    # -- the writer's side ------------------------------------------------------------

    @property
    def active(self) -> bool:
        """True while the cache keeps entries (some scanner is open)."""
        return self._active

    def reserve(self, count: int) -> int:
        """At the serialization point: reserve ``count`` consecutive slots (log order) and
        return the first, or -1 when inactive."""
        self._pending += count
        if not self._active:
            return -1
        slot = self._reserved
        self._reserved = slot + count
        return slot

    def put(self, slot: int, messages: Sequence[ImmutableMessage]) -> None:
        """The appends reserved at ``slot`` were acknowledged as ``messages``."""
        self._pending -= len(messages)
        if slot < self._durable_end or not self._active:
            return  # reserved before a reset or while inactive
        if slot != self._durable_end:
            self._parked[slot] = messages  # an earlier append is still in flight
            return
        self._append(messages)
        parked = self._parked
        while parked:
            more = parked.pop(self._durable_end, None)
            if more is None:
                break
            self._append(more)
        if self._waiters or self._tick_waiters:
            self._wake()

    def lose(self, slot: int, count: int) -> None:
        """The appends reserved at ``slot`` failed: they may or may not be in the log, so
        the cache can no longer vouch for what follows its newest entry, and until an
        entry is put no activation takes the writer's newest acknowledged id as its
        floor (a lost acknowledgement: the log holds a newer message)."""
        self._pending -= count
        self._lost_since_put = True
        if slot >= 0 and self._active:
            self._reset()

    def _append(self, messages: Sequence[ImmutableMessage]) -> None:
        if not self._floor_known:
            # The first entry after a reset: what precedes it is unknown, so it becomes
            # the floor and is not kept.
            self._floor, self._floor_known = messages[0].message_id, True
            self._lost_since_put = False
            self._start = self._head = self._durable_end = self._durable_end + 1
            messages = messages[1:]
            if not messages:
                return
        if self._head == self._durable_end:
            self._head_tick = messages[0].timetick
        self._items += messages
        self._durable_end += len(messages)
        size = 0
        for message in messages:
            size += len(message.payload) + len(message.vchannel)
        self._bytes += size + ENTRY_OVERHEAD * len(messages)
        if self._bytes > self.max_bytes:
            self._evict_to(self.max_bytes - self.max_bytes // 8)
        if messages[-1].timetick - self._head_tick > self._max_age_ticks:
            self._evict_older_than(messages[-1].timetick - self._max_age_ticks)

    def publish_idle_tick(self, tick: ImmutableMessage) -> None:
        """Make ``tick`` the newest idle TimeTick and wake the scanners waiting for one
        (``waiter(ticks=True)``); scanners waiting only for entries sleep on."""
        self.idle_tick = tick
        waiters = self._tick_waiters
        if waiters:
            self._tick_waiters = set()
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def acked(self, count: int) -> None:
        """Appends reserved while inactive were acknowledged or failed."""
        self._pending -= count

    def activate(self, last_acked: MessageId | None) -> None:
        """Start keeping entries (a no-op when ``max_bytes`` is 0: the cache is off).
        ``last_acked`` is the writer's newest acknowledged id: with no append in flight
        and none lost since the last entry put it is the floor; otherwise the floor is
        learned from the first entry put."""
        if self._active or self.max_bytes <= 0:
            return
        self._active = True
        self._clear()
        self._floor = last_acked
        self._floor_known = self._pending == 0 and not self._lost_since_put

    def deactivate(self) -> None:
        """Stop keeping entries and free them (the last scanner closed)."""
        self._active = False
        self._clear()
        self._floor_known = False

    def truncated(self, through: MessageId) -> None:
        """The log was truncated through ``through``: drop those entries too."""
        if not self._floor_known:
            return
        evicted = self.evicted
        self._drop_to(self._index_after(through))
        self.evicted = evicted  # truncation is not eviction
        if self._floor is None or self._floor < through:
            self._floor = through
        self._wake()

    def _reset(self) -> None:
        self.resets += 1
        self._clear()
        self._floor_known = False
        self._wake()

    def _clear(self) -> None:
        self._items.clear()
        self._parked.clear()
        self._start = self._head = self._durable_end = self._reserved
        self._bytes = 0

    # -- eviction -----------------------------------------------------------------------

    def _evict_to(self, target: int) -> None:
        items, start = self._items, self._start
        slot, freed, excess = self._head, 0, self._bytes - target
        while freed < excess and slot < self._durable_end:
            freed += _size(items[slot - start])
            slot += 1
        self._drop_to(slot)

    def _evict_older_than(self, tick: int) -> None:
        items, start = self._items, self._start
        lo, hi = self._head - start, self._durable_end - start
        self._drop_to(start + bisect.bisect_left(items, tick, lo, hi, key=_timetick))

    def _drop_to(self, slot: int) -> None:
        """Evict every entry before ``slot``."""
        items, start = self._items, self._start
        if slot <= self._head:
            return
        freed = 0
        for message in items[self._head - start : slot - start]:
            freed += _size(message)
        self._bytes -= freed
        self.evicted += slot - self._head
        self._floor = items[slot - 1 - start].message_id
        self._head = slot
        if slot < self._durable_end:
            self._head_tick = items[slot - start].timetick
        drop = slot - start
        if drop >= _COMPACT_AT and drop * 2 >= len(items):
            del items[:drop]
            self._start = slot

    # -- the readers' side --------------------------------------------------------------

    def slot_after(self, position: MessageId | None) -> int | None:
        """The slot of the first message after ``position`` (None: the log's start), or
        None if the cache cannot vouch for every message after it (not active, the floor
        is above ``position``, or ``position`` is past the newest entry put)."""
        if not self._active or not self._floor_known:
            return None
        floor = self._floor
        if position is None:
            return self._head if floor is None else None
        if floor is not None and position < floor:
            return None
        newest = self._newest_id()
        if newest is None or position > newest:
            return None
        return self._index_after(position)

    def slot_from(self, message_id: MessageId) -> int | None:
        """The slot of ``message_id`` if the cache holds it, else None."""
        if not self._active or not self._floor_known:
            return None
        floor, newest = self._floor, self._newest_id()
        if newest is None or message_id > newest or (floor is not None and message_id <= floor):
            return None
        lo, hi = self._head - self._start, self._durable_end - self._start
        return self._start + bisect.bisect_left(self._items, message_id, lo, hi, key=_id)

    def _newest_id(self) -> MessageId | None:
        if self._head == self._durable_end:
            return self._floor
        return self._items[self._durable_end - 1 - self._start].message_id

    def slot_latest(self) -> int | None:
        """The slot a ``latest`` reader starts at, if the cache can serve it."""
        if not self._active or not self._floor_known or self._pending:
            return None
        return self._durable_end

    def _index_after(self, position: MessageId) -> int:
        lo, hi = self._head - self._start, self._durable_end - self._start
        return self._start + bisect.bisect_right(self._items, position, lo, hi, key=_id)

    def evicted_before(self, slot: int) -> bool:
        """True if the entry at ``slot`` was evicted (or the cache reset past it)."""
        return slot < self._head

    def has_entry(self, slot: int) -> bool:
        """True if the cache holds an acknowledged entry at ``slot`` (not evicted)."""
        return self._head <= slot < self._durable_end

    def read(
        self, slot: int, selected: Filter, limit: int = _BATCH
    ) -> tuple[list[ImmutableMessage], int, MessageId | None]:
        """The entries ``selected`` admits among up to ``limit`` from ``slot``, the slot
        after the last one examined (``slot`` itself when nothing is there yet) and that
        entry's id. The caller checks ``evicted_before`` first."""
        start = self._start
        end = min(self._durable_end, slot + limit)
        if slot >= end:
            return [], slot, None
        chunk = self._items[slot - start : end - start]
        last = chunk[-1].message_id
        if selected.is_everything:
            return chunk, end, last
        admits = selected.admits
        return [m for m in chunk if admits(m)], end, last

    def id_before(self, slot: int) -> MessageId | None:
        """The id of the entry just before ``slot`` (the floor at the head)."""
        if slot <= self._head:
            return self._floor
        return self._items[slot - 1 - self._start].message_id

    def waiter(self, *, ticks: bool) -> asyncio.Future[None]:
        """A future resolved at the next put, reset, truncation or close, and with
        ``ticks`` at the next idle tick too (a scanner whose pipeline drops idle ticks
        waits without them, so an idle writer does not wake it 100 times a second)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if ticks:
            self._tick_waiters.add(waiter)
            if self.on_activity is not None:
                self.on_activity()
        else:
            self._waiters.add(waiter)
        return waiter

    def want_ticks(self, waiter: asyncio.Future[None]) -> None:
        """Make a waiting ``waiter(ticks=False)`` one that idle ticks wake too."""
        if waiter in self._waiters:
            self._waiters.discard(waiter)
            self._tick_waiters.add(waiter)
            if self.on_activity is not None:
                self.on_activity()

    def forget_waiter(self, waiter: asyncio.Future[None]) -> None:
        """Drop a waiter that is no longer awaited."""
        self._waiters.discard(waiter)
        self._tick_waiters.discard(waiter)

    def has_waiters(self) -> bool:
        """True if a scanner waits for the next message."""
        return bool(self._waiters) or bool(self._tick_waiters)

    def has_tick_waiters(self) -> bool:
        """True if a scanner waits and would take an idle tick now."""
        return bool(self._tick_waiters)

    def wake(self) -> None:
        """Resolve every waiter (the WAL closed, or a scanner must re-check its state)."""
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        ticks, self._tick_waiters = self._tick_waiters, set()
        for waiter in (*waiters, *ticks):
            if not waiter.done():
                waiter.set_result(None)

    def note_reader(self, reader: object, slot: int | None) -> None:
        """Record where ``reader`` is (None: it is not reading from the cache)."""
        if slot is None:
            self._readers.pop(reader, None)
        else:
            self._readers[reader] = slot

    def stats(self) -> CacheStats:
        """A snapshot of the cache's size, coverage, readers and pressure."""
        head, end, start = self._head, self._durable_end, self._start
        held = end - head
        pressure = 0.0
        if held:
            behind = [end - max(slot, head) for slot in self._readers.values()]
            pressure = max(behind, default=0) / held
        return CacheStats(
            active=self._active,
            messages=held,
            bytes=self._bytes,
            max_bytes=self.max_bytes,
            max_age=self.max_age,
            oldest_id=self._items[head - start].message_id if held else None,
            newest_id=self._items[end - 1 - start].message_id if held else None,
            readers=len(self._readers),
            pressure=min(1.0, pressure),
            evicted=self.evicted,
            resets=self.resets,
        )


def _id(message: ImmutableMessage) -> MessageId:
    return message.message_id


def _timetick(message: ImmutableMessage) -> int:
    return message.timetick
