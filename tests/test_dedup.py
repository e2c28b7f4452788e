"""Dedup: exactly-once keyed appends, the window across restarts, ambiguous failures."""

from __future__ import annotations

import asyncio
import uuid

import _faulty
import pytest
from _chain_support import FakeClock, data, log_of, member, open_manual

import interceptors
import walsvc
from interceptors import Dedup

_faulty.register()


async def test_a_retried_key_gets_the_original_result_and_is_written_once(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        first = await wal.append(data(b"x", idempotency_key="k1"))
        again = await wal.append(data(b"x", idempotency_key="k1"))
        other_vchannel = await wal.append(data(b"x", vchannel="v2", idempotency_key="k1"))
        both = await asyncio.gather(
            *(wal.append(data(b"y", idempotency_key="k2")) for _ in range(5))
        )
        batch = await wal.append_many(
            [data(b"z", idempotency_key="k3"), data(b"x", idempotency_key="k1")]
        )
        log = await log_of(wal)
    assert again == first
    assert batch[1] == first
    assert other_vchannel != first
    assert len(set(both)) == 1
    keys = [(m.vchannel, m.idempotency_key) for m in log if m.idempotency_key]
    assert sorted(keys) == [("v1", "k1"), ("v1", "k2"), ("v1", "k3"), ("v2", "k1")]


async def test_the_window_survives_a_restart(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        first = await wal.append(data(b"x", idempotency_key=walsvc.producer_key("p", 7)))
    async with await walsvc.open_wal(url, "p0") as wal:
        again = await wal.append(data(b"x", idempotency_key=walsvc.producer_key("p", 7)))
        assert member(wal, Dedup).rebuilt == 1
        log = await log_of(wal)
    assert again == first
    assert sum(1 for m in log if m.idempotency_key) == 1


async def test_the_window_forgets_by_count_and_by_age(clock: FakeClock) -> None:
    name = f"memory://{uuid.uuid4().hex}"
    chain = interceptors.default_chain(sync_interval=None, dedup=Dedup(max_keys=2, max_age=60))
    async with await open_manual(name, clock, interceptors=chain) as wal:
        for key in ("a", "b", "c"):
            await wal.append(data(b"x", idempotency_key=key))
        assert len(member(wal, Dedup)) == 2  # "a" was evicted by count
        clock.ms += 61_000
        await wal.append(data(b"x", idempotency_key="d"))
        assert len(member(wal, Dedup)) == 1  # "b" and "c" aged out


async def test_an_ambiguous_failure_is_resolved_by_reading_the_log() -> None:
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "p") as wal:
        await wal.wait_ready()  # the opening TimeTick is written
        _faulty.FaultyBackend.faults["p"] = ["lost-ack"]
        landed = await wal.append(data(b"x", idempotency_key="k"))  # written: answered
        assert await wal.append(data(b"x", idempotency_key="k")) == landed
        _faulty.FaultyBackend.faults["p"] = ["lost-write"]
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await wal.append(data(b"y", idempotency_key="j"))  # not written: released
        retried = await wal.append(data(b"y", idempotency_key="j"))
        log = await log_of(wal)
    assert [m.idempotency_key for m in log if m.idempotency_key] == ["k", "j"]
    assert log[-1].message_id == retried.message_id or log[-2].message_id == retried.message_id


async def test_a_key_stays_blocked_while_the_log_cannot_be_read() -> None:
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "q") as wal:
        await wal.append(data(b"ready"))
        _faulty.FaultyBackend.faults["q"] = ["lost-ack"]
        _faulty.FaultyBackend.unreadable.add("q")
        try:
            for _ in range(2):
                with pytest.raises(walsvc.AppendOutcomeUnknown, match="blocked"):
                    await wal.append(data(b"x", idempotency_key="k"))
        finally:
            _faulty.FaultyBackend.unreadable.discard("q")
    async with await walsvc.open_wal(name, "q") as wal:  # the rebuild resolves it
        again = await wal.append(data(b"x", idempotency_key="k"))
        log = await log_of(wal)
    assert [m.message_id for m in log if m.idempotency_key == "k"] == [again.message_id]


async def test_a_keyed_batch_is_appended_as_one_batch_and_answered_on_retry(url: str) -> None:
    """New keys of a batch land contiguously in one backend call; a retried batch (or a
    batch mixing known and new keys) appends only what is new, results in order."""
    async with await walsvc.open_wal(url, "p0") as wal:
        keys = [walsvc.producer_key("spark", i) for i in range(50)]
        first = await wal.append_many(
            [data(b"%d" % i, idempotency_key=k) for i, k in enumerate(keys)]
        )
        seqs = [r.message_id.seq for r in first]
        assert seqs == list(range(seqs[0], seqs[0] + 50))  # contiguous
        again = await wal.append_many(
            [data(b"%d" % i, idempotency_key=k) for i, k in enumerate(keys)]
        )
        mixed = await wal.append_many(
            [
                data(b"new", idempotency_key="n1"),
                data(b"0", idempotency_key=keys[0]),
                data(b"plain"),
            ]
        )
        log = await log_of(wal)
    assert again == first
    assert mixed[1] == first[0]
    assert mixed[2].message_id == mixed[0].message_id.__class__(mixed[0].message_id.seq + 1)
    keyed = [m.idempotency_key for m in log if m.idempotency_key]
    assert keyed == [*keys, "n1"]


async def test_a_batch_repeating_a_key_or_racing_another_append_of_it_goes_one_by_one(
    url: str,
) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        twice = await wal.append_many(
            [data(b"a", idempotency_key="dup"), data(b"b", idempotency_key="dup")]
        )
        racing = await asyncio.gather(
            wal.append(data(b"c", idempotency_key="race")),
            wal.append_many([data(b"c", idempotency_key="race"), data(b"d", idempotency_key="e")]),
        )
        log = await log_of(wal)
    assert twice[0] == twice[1]
    assert racing[1][0] == racing[0]
    assert sorted(m.idempotency_key for m in log if m.idempotency_key) == ["dup", "e", "race"]


async def test_an_ambiguous_batch_is_resolved_key_by_key() -> None:
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "b") as wal:
        await wal.wait_ready()
        batch = [data(b"%d" % i, idempotency_key=f"k{i}") for i in range(3)]
        _faulty.FaultyBackend.faults["b"] = ["lost-ack"]
        landed = await wal.append_many(batch)  # every key found in the log: answered
        assert await wal.append_many(batch) == landed
        other = [data(b"%d" % i, idempotency_key=f"j{i}") for i in range(3)]
        _faulty.FaultyBackend.faults["b"] = ["lost-write"]
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await wal.append_many(other)  # not written: every key released
        retried = await wal.append_many(other)
        log = await log_of(wal)
    keyed = [m.idempotency_key for m in log if m.idempotency_key]
    assert keyed == ["k0", "k1", "k2", "j0", "j1", "j2"]
    assert [r.message_id for r in retried] == [m.message_id for m in log if m.idempotency_key][3:]
