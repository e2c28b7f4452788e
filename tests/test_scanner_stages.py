"""The read pipeline's stages on their own: ReorderBuffer, TxnBuffer, TailCache."""

from __future__ import annotations

import random
from typing import Any

import pytest

import walsvc
from scanners import ReorderBuffer, TailCache, TxnBuffer
from scanners._tail_cache import ENTRY_OVERHEAD
from walsvc import Filter, ImmutableMessage, MessageType, TxnContext
from walsvc.backends._memory import MemoryMessageId


def msg(
    seq: int,
    tick: int,
    *,
    type_: MessageType = MessageType.INSERT,
    vchannel: str = "v1",
    payload: bytes = b"",
    txn: TxnContext | None = None,
    term: int = 1,
) -> ImmutableMessage:
    return ImmutableMessage(
        MemoryMessageId(seq), tick, vchannel, type_, payload, {}, None, txn, None, term
    )


# -- ReorderBuffer ------------------------------------------------------------------------


def test_ordered_input_passes_through_uncopied() -> None:
    buffer = ReorderBuffer()
    batch = [msg(i, 10 + i) for i in range(5)]
    assert buffer.push(batch) is batch
    assert buffer.rejected == 0


def test_tick_regressions_and_stale_terms_are_rejected() -> None:
    buffer = ReorderBuffer()
    assert buffer.push([msg(0, 10, term=2), msg(1, 20, term=2)])
    out = buffer.push([msg(2, 15, term=2), msg(3, 30, term=1), msg(4, 40, term=2)])
    assert [m.message_id.seq for m in out] == [4]  # type: ignore[attr-defined]
    assert buffer.rejected == 2


def test_unordered_input_is_held_until_a_timetick_confirms_it() -> None:
    buffer = ReorderBuffer(ordered=False)
    ticks = [50, 10, 40, 20, 30]
    assert buffer.push([msg(i, t) for i, t in enumerate(ticks)]) == []
    assert buffer.held == 5
    out = buffer.push([msg(5, 35, type_=MessageType.TIME_TICK, vchannel="")])
    assert [m.timetick for m in out] == [10, 20, 30, 35]
    out = buffer.push([msg(6, 60, type_=MessageType.TIME_TICK, vchannel="")])
    assert [m.timetick for m in out] == [40, 50, 60]
    # Below a released tick: rejected.
    assert buffer.push([msg(7, 55)]) == []
    assert buffer.rejected == 1


def test_unordered_release_is_a_sorted_merge() -> None:
    rng = random.Random(7)
    buffer = ReorderBuffer(ordered=False)
    released: list[int] = []
    next_tick, seq = 1, 0
    for _ in range(50):
        window = list(range(next_tick, next_tick + 20))
        next_tick += 21
        rng.shuffle(window)
        batch = [msg(seq + i, t) for i, t in enumerate(window)]
        seq += len(batch)
        batch.append(msg(seq, next_tick - 1, type_=MessageType.TIME_TICK, vchannel=""))
        seq += 1
        released += [m.timetick for m in buffer.push(batch)]
    assert released == sorted(released)
    assert len(released) == 50 * 21


# -- TxnBuffer ----------------------------------------------------------------------------


def txn_msg(seq: int, tick: int, kind: MessageType, txn_id: int, payload: bytes = b"") -> Any:
    return msg(seq, tick, type_=kind, txn=TxnContext(txn_id, 1000), payload=payload)


def test_a_committed_txn_is_one_message_with_its_body_at_the_commit_tick() -> None:
    buffer = TxnBuffer(max_bytes=1 << 20)
    out = list(buffer.push([txn_msg(0, 10, MessageType.BEGIN_TXN, 7), msg(1, 11)]))
    out += buffer.push(
        [txn_msg(2, 12, MessageType.INSERT, 7, b"a"), txn_msg(3, 13, MessageType.DELETE, 7, b"b")]
    )
    assert buffer.open_count == 1
    assert buffer.held_bytes == 2
    out += buffer.push([txn_msg(4, 14, MessageType.COMMIT_TXN, 7), msg(5, 15)])
    assert [m.type for m in out] == [MessageType.INSERT, MessageType.TXN, MessageType.INSERT]
    txn = out[1]
    assert (txn.message_id, txn.timetick) == (MemoryMessageId(4), 14)
    assert [(m.payload, m.timetick, m.message_id) for m in txn.body] == [
        (b"a", 14, MemoryMessageId(2)),
        (b"b", 14, MemoryMessageId(3)),
    ]
    assert buffer.open_count == 0
    assert buffer.held_bytes == 0


def test_rollback_discards_and_orphans_are_ignored() -> None:
    buffer = TxnBuffer(max_bytes=1 << 20)
    out = buffer.push(
        [
            txn_msg(0, 10, MessageType.BEGIN_TXN, 1),
            txn_msg(1, 11, MessageType.INSERT, 1, b"x"),
            txn_msg(2, 12, MessageType.ROLLBACK_TXN, 1),
            txn_msg(3, 13, MessageType.INSERT, 2, b"no begin"),
            txn_msg(4, 14, MessageType.COMMIT_TXN, 2),
            txn_msg(5, 15, MessageType.BEGIN_TXN, 3),
            txn_msg(6, 16, MessageType.BEGIN_TXN, 3),
            txn_msg(7, 17, MessageType.COMMIT_TXN, 3),
        ]
    )
    assert [(m.type, m.body) for m in out] == [(MessageType.TXN, ())]
    assert buffer.ignored == 3


def test_a_txn_over_the_limit_raises_instead_of_growing() -> None:
    buffer = TxnBuffer(max_bytes=10)
    buffer.push(
        [txn_msg(0, 1, MessageType.BEGIN_TXN, 1), txn_msg(1, 2, MessageType.INSERT, 1, b"x" * 10)]
    )
    with pytest.raises(walsvc.TxnBufferFull, match="txn_buffer_bytes=10"):
        buffer.push([txn_msg(2, 3, MessageType.INSERT, 1, b"y")])


# -- TailCache ----------------------------------------------------------------------------


def filled(cache: TailCache, first: int, count: int, *, tick0: int = 1000) -> None:
    slot = cache.reserve(count)
    cache.put(slot, [msg(first + i, tick0 + first + i) for i in range(count)])


def test_an_inactive_cache_keeps_nothing_and_vouches_for_nothing() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    assert cache.reserve(1) == -1
    cache.acked(1)
    assert cache.slot_after(None) is None
    assert cache.stats().messages == 0


def test_floor_and_positions() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    cache.activate(MemoryMessageId(9))  # nothing in flight: the floor is the newest id
    filled(cache, 10, 5)
    assert cache.slot_after(MemoryMessageId(8)) is None  # below the floor
    assert cache.slot_after(None) is None
    start = cache.slot_after(MemoryMessageId(9))
    assert start is not None
    batch, after, last = cache.read(start, Filter.everything())
    assert [m.message_id for m in batch] == [MemoryMessageId(i) for i in range(10, 15)]
    assert last == MemoryMessageId(14)
    assert after == start + 5
    assert cache.slot_after(MemoryMessageId(15)) is None  # past the newest: not yet
    assert cache.slot_from(MemoryMessageId(12)) == start + 2
    assert cache.slot_from(MemoryMessageId(9)) is None


def test_out_of_order_acks_are_delivered_in_log_order() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    cache.activate(None)
    first = cache.reserve(2)
    second = cache.reserve(1)
    cache.put(second, [msg(2, 3)])
    assert cache.read(first, Filter.everything())[0] == []  # the first is still in flight
    cache.put(first, [msg(0, 1), msg(1, 2)])
    batch, _, _ = cache.read(first, Filter.everything())
    assert [m.timetick for m in batch] == [1, 2, 3]


def test_a_lost_append_resets_the_cache_and_the_next_entry_becomes_the_floor() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    cache.activate(None)
    filled(cache, 0, 3)
    lost = cache.reserve(1)
    cache.lose(lost, 1)  # may or may not be in the log
    assert cache.resets == 1
    assert cache.slot_after(MemoryMessageId(2)) is None
    filled(cache, 4, 3)  # id 4 becomes the floor: only what follows it is vouched for
    assert cache.slot_after(MemoryMessageId(3)) is None
    slot = cache.slot_after(MemoryMessageId(4))
    assert slot is not None
    assert [m.message_id.seq for m in cache.read(slot, Filter.everything())[0]] == [5, 6]  # type: ignore[attr-defined]


def test_activation_with_appends_in_flight_learns_the_floor_from_the_first_entry() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    early = cache.reserve(1)  # inactive: not a slot
    cache.activate(MemoryMessageId(0))
    filled(cache, 2, 2)
    assert early == -1
    cache.acked(1)
    assert cache.slot_after(MemoryMessageId(1)) is None
    assert cache.slot_after(MemoryMessageId(2)) is not None


def test_eviction_by_bytes_moves_the_floor_and_counts() -> None:
    size = 100 + 2 + ENTRY_OVERHEAD
    cache = TailCache(max_bytes=10 * size, max_age=30.0)
    cache.activate(None)
    reader_slot = cache.slot_after(None)
    assert reader_slot is not None
    for i in range(30):
        slot = cache.reserve(1)
        cache.put(slot, [msg(i, 1000 + i, payload=b"p" * 100)])
    stats = cache.stats()
    assert stats.bytes <= 10 * size
    assert stats.messages <= 10
    assert stats.evicted >= 20
    assert cache.evicted_before(reader_slot)
    assert stats.oldest_id is not None
    floor_ok = cache.slot_after(MemoryMessageId(stats.oldest_id.seq - 1))  # type: ignore[attr-defined]
    assert floor_ok is not None
    assert cache.slot_after(MemoryMessageId(stats.oldest_id.seq - 2)) is None  # type: ignore[attr-defined]


def test_eviction_by_age_uses_timetick_milliseconds() -> None:
    cache = TailCache(max_bytes=1 << 30, max_age=1.0)
    cache.activate(None)
    ms = 1 << 18  # one millisecond of the hybrid clock
    for i in range(5):
        slot = cache.reserve(1)
        cache.put(slot, [msg(i, i * 600 * ms)])  # 600 ms apart
    stats = cache.stats()
    # The newest is at 2400 ms: only entries at most 1 s older stay (1800, 2400).
    assert stats.oldest_id == MemoryMessageId(3)
    assert stats.messages == 2


def test_truncation_drops_entries_and_is_not_eviction() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    cache.activate(None)
    filled(cache, 0, 10)
    cache.truncated(MemoryMessageId(4))
    stats = cache.stats()
    assert stats.oldest_id == MemoryMessageId(5)
    assert stats.evicted == 0
    assert cache.slot_after(None) is None
    assert cache.slot_after(MemoryMessageId(4)) is not None


def test_pressure_reports_the_reader_furthest_behind() -> None:
    cache = TailCache(max_bytes=1 << 20, max_age=30.0)
    cache.activate(None)
    filled(cache, 0, 10)
    head = cache.slot_after(None)
    assert head is not None
    slow, fast = object(), object()
    cache.note_reader(slow, head + 2)
    cache.note_reader(fast, head + 10)
    stats = cache.stats()
    assert stats.readers == 2
    assert stats.pressure == pytest.approx(0.8)


def test_a_disabled_cache_never_activates() -> None:
    cache = TailCache(max_bytes=0, max_age=30.0)
    cache.activate(None)
    assert not cache.active
    assert cache.reserve(1) == -1
