"""Keyed appends together: concurrent appends with idempotency keys share one pass down
the batch chain (Dedup claims their keys, appends the new ones as one batch and settles
each from its result), and keyed ``append_many`` batches land as one batch, with every
exactly-once promise of Dedup kept: retries of a key in flight wait for it, a caller
cancelled once its batch started does not stop it, an ambiguous batch is resolved from
the log."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import _faulty
import pytest
from _chain_support import BatchSizes, HoldBatches, data, log_of, member

import walsvc
from interceptors import Dedup, default_chain
from walsvc import AppendResult, Message
from walsvc.core._chain import AppendBatchNext, AppendNext

_faulty.register()

PRODUCERS = 40


async def open_observed(url: str, observer: BatchSizes, **options: object) -> walsvc.WAL:
    chain = [*default_chain(sync_interval=None), observer]
    wal = await walsvc.open_wal(url, "p0", interceptors=chain, **options)
    await wal.wait_ready()
    if isinstance(observer, HoldBatches):
        observer.release.set()
    await wal.append(data(b"warm", idempotency_key="warm"))  # the window is rebuilt
    observer.sizes.clear()
    if isinstance(observer, HoldBatches):
        observer.release.clear()
        observer.holding.clear()
    return wal


def keyed(key: str, payload: bytes = b"x") -> Message:
    return data(payload, idempotency_key=key)


def keys_in(log: Sequence[walsvc.ImmutableMessage]) -> Counter[str]:
    return Counter(m.idempotency_key for m in log if m.idempotency_key not in (None, "warm"))


async def test_concurrent_keyed_appends_share_batches(url: str) -> None:
    sizes = BatchSizes()
    async with await open_observed(url, sizes) as wal:
        results = await asyncio.gather(*(wal.append(keyed(f"k{n}")) for n in range(PRODUCERS)))
        log = await log_of(wal)
    assert sum(sizes.sizes) == PRODUCERS
    assert len(sizes.sizes) < PRODUCERS  # some appends shared a batch
    assert len(set(results)) == PRODUCERS
    assert keys_in(log) == Counter(f"k{n}" for n in range(PRODUCERS))
    where = {m.idempotency_key: m.message_id for m in log}
    assert [r.message_id for r in results] == [where[f"k{n}"] for n in range(PRODUCERS)]


async def test_a_key_twice_in_one_coalesced_batch_is_appended_once(tmp_path: Path) -> None:
    sizes = BatchSizes()
    async with await open_observed(f"file://{tmp_path}", sizes) as wal:
        names = ["a", "b", "dup", "c", "dup", "d"]
        results = await asyncio.gather(*(wal.append(keyed(k)) for k in names))
        log = await log_of(wal)
    assert sizes.sizes == [5]
    assert results[2] == results[4]
    assert keys_in(log) == Counter({"a": 1, "b": 1, "dup": 1, "c": 1, "d": 1})


async def test_a_retry_of_a_key_in_flight_waits_for_its_owner_and_the_rest_go_together(
    tmp_path: Path,
) -> None:
    """A coalesced batch holding a key whose owner is still appending: the others of the
    batch are appended together; the retry waits for the owner and gets its result."""
    hold = HoldBatches()
    async with await open_observed(f"file://{tmp_path}", hold) as wal:
        first = [asyncio.ensure_future(wal.append(keyed(f"k{n}"))) for n in range(5)]
        await hold.holding.wait()  # the first batch is on its way
        second = [asyncio.ensure_future(wal.append(keyed(k))) for k in ("n0", "k2", "n1", "n2")]
        for _ in range(5):
            await asyncio.sleep(0)
        assert not any(f.done() for f in first + second)
        hold.release.set()
        async with asyncio.timeout(10):
            answers = await asyncio.gather(*first, *second)
        log = await log_of(wal)
    assert hold.sizes == [5, 3]  # the retry appended nothing
    assert answers[5 + 1] == answers[2]
    assert keys_in(log) == Counter(["k0", "k1", "k2", "k3", "k4", "n0", "n1", "n2"])


async def test_a_keyed_append_many_with_a_repeated_key_lands_as_one_batch(url: str) -> None:
    sizes = BatchSizes()
    async with await open_observed(url, sizes) as wal:
        names = [f"k{i}" for i in range(100)]
        names[50] = names[10]
        results = await wal.append_many([keyed(k, b"%d" % i) for i, k in enumerate(names)])
        again = await wal.append_many([keyed(k, b"%d" % i) for i, k in enumerate(names)])
        log = await log_of(wal)
    assert sizes.sizes == [99]  # one batch; the retry of the whole batch appended nothing
    assert again == results
    assert results[50] == results[10]
    seqs = [r.message_id.seq for i, r in enumerate(results) if i != 50]
    assert seqs == list(range(seqs[0], seqs[0] + 99))  # contiguous
    assert keys_in(log) == Counter(set(names))


async def test_a_keyed_append_many_waits_for_its_key_in_flight_then_lands_as_one_batch(
    tmp_path: Path,
) -> None:
    hold = HoldBatches()
    async with await open_observed(f"file://{tmp_path}", hold) as wal:
        single = asyncio.ensure_future(wal.append(keyed("k")))
        await hold.holding.wait()
        many = asyncio.ensure_future(wal.append_many([keyed("a"), keyed("k"), keyed("b")]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not many.done()  # it waits for the owner of "k"
        hold.release.set()
        async with asyncio.timeout(10):
            alone, batch = await single, await many
        log = await log_of(wal)
    assert batch[1] == alone
    assert hold.sizes == [1, 2]
    assert batch[2].message_id.seq == batch[0].message_id.seq + 1
    assert keys_in(log) == Counter(["k", "a", "b"])


async def test_a_caller_cancelled_before_its_batch_starts_appends_nothing(tmp_path: Path) -> None:
    sizes = BatchSizes()
    async with await open_observed(f"file://{tmp_path}", sizes) as wal:
        appends = [asyncio.ensure_future(wal.append(keyed(f"k{n}"))) for n in range(5)]
        await asyncio.sleep(0)  # every append is queued; none is in a batch yet
        appends[1].cancel()
        outcomes = await asyncio.gather(*appends, return_exceptions=True)
        assert isinstance(outcomes[1], asyncio.CancelledError)
        assert keys_in(await log_of(wal)) == Counter(["k0", "k2", "k3", "k4"])
        retried = await wal.append(keyed("k1"))  # the key was never claimed: appended now
        log = await log_of(wal)
    assert keys_in(log) == Counter(f"k{n}" for n in range(5))
    assert [m.message_id for m in log if m.idempotency_key == "k1"] == [retried.message_id]


async def test_a_caller_cancelled_while_its_batch_runs_is_answered_to_its_retry(
    tmp_path: Path,
) -> None:
    """Cancellation of one caller of a coalesced batch: the batch runs to its end, the
    others are answered, and the retry of the cancelled one (made while the batch still
    runs, and after) gets the result of its message, which is in the log once."""
    hold = HoldBatches()
    async with await open_observed(f"file://{tmp_path}", hold) as wal:
        appends = [asyncio.ensure_future(wal.append(keyed(f"k{n}"))) for n in range(5)]
        await hold.holding.wait()
        appends[2].cancel()
        early_retry = asyncio.ensure_future(wal.append(keyed("k2")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not early_retry.done()  # it waits for the batch, the key's owner
        hold.release.set()
        async with asyncio.timeout(10):
            outcomes = await asyncio.gather(*appends, return_exceptions=True)
            early = await early_retry
        late = await wal.append(keyed("k2"))
        log = await log_of(wal)
    assert isinstance(outcomes[2], asyncio.CancelledError)
    assert all(isinstance(o, AppendResult) for i, o in enumerate(outcomes) if i != 2)
    assert keys_in(log) == Counter(f"k{n}" for n in range(5))
    assert early == late
    assert [m.message_id for m in log if m.idempotency_key == "k2"] == [early.message_id]
    assert hold.sizes == [5]


async def test_only_the_oversized_message_of_a_coalesced_keyed_batch_fails(
    tmp_path: Path,
) -> None:
    sizes = BatchSizes()
    async with await open_observed(f"file://{tmp_path}", sizes, max_message_size=4096) as wal:
        payloads = [b"s", b"s", b"L" * 8192, b"s", b"s"]
        outcomes = await asyncio.gather(
            *(wal.append(keyed(f"k{n}", p)) for n, p in enumerate(payloads)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[2], walsvc.MessageTooLarge)
        assert all(isinstance(o, AppendResult) for i, o in enumerate(outcomes) if i != 2)
        fixed = await wal.append(keyed("k2", b"s"))  # its key was released
        assert await wal.append(keyed("k2", b"s")) == fixed
        log = await log_of(wal)
    assert keys_in(log) == Counter(f"k{n}" for n in range(5))


async def test_an_ambiguous_coalesced_batch_is_resolved_from_the_log() -> None:
    """lost-ack: the batch landed, every caller gets its result and a retry appends
    nothing; lost-write: nothing landed, every caller learns the outcome was unknown and
    its key is free, so the retries append each key once."""
    sizes = BatchSizes()
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await open_observed(name, sizes) as wal:
        _faulty.FaultyBackend.faults["p0"] = ["lost-ack"]
        landed = await asyncio.gather(*(wal.append(keyed(f"a{n}")) for n in range(5)))
        assert await asyncio.gather(*(wal.append(keyed(f"a{n}")) for n in range(5))) == landed
        _faulty.FaultyBackend.faults["p0"] = ["lost-write"]
        lost = await asyncio.gather(
            *(wal.append(keyed(f"b{n}")) for n in range(5)), return_exceptions=True
        )
        assert all(isinstance(o, walsvc.AppendOutcomeUnknown) for o in lost), lost
        retried = await asyncio.gather(*(wal.append(keyed(f"b{n}")) for n in range(5)))
        log = await log_of(wal)
    assert sizes.sizes == [5, 5, 5]  # the answered retry appended nothing
    assert keys_in(log) == Counter([*(f"a{n}" for n in range(5)), *(f"b{n}" for n in range(5))])
    where = {m.idempotency_key: m.message_id for m in log}
    assert [r.message_id for r in retried] == [where[f"b{n}"] for n in range(5)]


async def test_a_key_released_and_claimed_again_is_evicted_in_its_new_place() -> None:
    """The window forgets the oldest keys first, by when they were last claimed: a key
    whose append failed (released) and which was appended again later is younger than
    the keys appended in between."""
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    chain = default_chain(sync_interval=None, dedup=Dedup(max_keys=3))
    async with await walsvc.open_wal(name, "p0", interceptors=chain) as wal:
        await wal.wait_ready()
        await member(wal, Dedup).wait_rebuilt()
        _faulty.FaultyBackend.faults["p0"] = ["lost-write"]
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await wal.append(keyed("a"))  # not written: released
        await wal.append(keyed("b"))
        await wal.append(keyed("c"))
        first_a = await wal.append(keyed("a"))
        await wal.append(keyed("d"))  # four keys: "b" goes, not "a"
        assert await wal.append(keyed("a")) == first_a
        await wal.append(keyed("b"))  # forgotten: appended again
        log = await log_of(wal)
    assert keys_in(log) == Counter({"a": 1, "b": 2, "c": 1, "d": 1})


async def test_many_released_keys_leave_no_trace_in_the_window(tmp_path: Path) -> None:
    """Keys released by failed appends (here: too large, refused before writing) while
    few keys settle do not pile up in the window's bookkeeping."""
    sizes = BatchSizes()
    async with await open_observed(f"file://{tmp_path}", sizes, max_message_size=4096) as wal:
        dedup = member(wal, Dedup)
        for round_ in range(12):
            outcomes = await asyncio.gather(
                *(wal.append(keyed(f"big{round_}.{n}", b"L" * 8192)) for n in range(100)),
                wal.append(keyed(f"ok{round_}")),
                return_exceptions=True,
            )
            assert all(isinstance(o, walsvc.MessageTooLarge) for o in outcomes[:-1])
            assert isinstance(outcomes[-1], AppendResult)
        assert len(dedup) == 13  # "warm" and the twelve that landed
        assert len(dedup._keys.order) <= 2 * len(dedup) + 1024
        again = await asyncio.gather(*(wal.append(keyed(f"ok{r}")) for r in range(12)))
        log = await log_of(wal)
    assert [r.message_id for r in again] == [
        m.message_id for m in log if (m.idempotency_key or "").startswith("ok")
    ]


async def test_keys_and_vchannels_with_nul_characters_stay_apart(url: str) -> None:
    """The window joins vchannel and key with a NUL when the vchannel has none: a key
    with a NUL in it, and a vchannel with one, name distinct messages all the same."""
    pairs = [("v", "a\x00b"), ("v\x00a", "b"), ("v\x00a\x00b", ""), ("v", "a")]
    async with await walsvc.open_wal(url, "p0") as wal:
        first = await asyncio.gather(
            *(wal.append(data(b"x", vchannel=v, idempotency_key=k or "z")) for v, k in pairs)
        )
        again = await asyncio.gather(
            *(wal.append(data(b"x", vchannel=v, idempotency_key=k or "z")) for v, k in pairs)
        )
        log = await log_of(wal)
    assert again == first
    assert len(set(first)) == len(pairs)
    stored = Counter((m.vchannel, m.idempotency_key) for m in log if m.idempotency_key)
    assert stored == Counter((v, k or "z") for v, k in pairs)


class DropsAResult:
    """A faulty interceptor: returns one result fewer than the batch it appended."""

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        return (await call_next(messages))[:-1]


async def test_a_chain_that_loses_a_result_is_read_from_the_log(tmp_path: Path) -> None:
    """A keyed batch whose results the chain garbled is an ambiguous append: Dedup reads
    the log, finds every key, and answers each producer with its message's result."""
    chain = [*default_chain(sync_interval=None), DropsAResult()]
    async with await walsvc.open_wal(f"file://{tmp_path}", "p0", interceptors=chain) as wal:
        await wal.wait_ready()
        results = await asyncio.gather(*(wal.append(keyed(f"k{n}")) for n in range(PRODUCERS)))
        log = await log_of(wal)
    where = {m.idempotency_key: m.message_id for m in log}
    assert [r.message_id for r in results] == [where[f"k{n}"] for n in range(PRODUCERS)]
    assert keys_in(log) == Counter(f"k{n}" for n in range(PRODUCERS))


class HoldKey(BatchSizes):
    """``BatchSizes`` that holds the appends of messages with idempotency key ``key``
    until ``release`` is set."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        await self._hold([message])
        return await super().do_append(message, call_next)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        await self._hold(messages)
        return await super().do_append_batch(messages, call_next)

    async def _hold(self, messages: Sequence[Message]) -> None:
        if any(m.idempotency_key == self.key for m in messages):
            self.holding.set()
            await self.release.wait()


async def test_the_oldest_key_in_flight_holds_eviction_by_count_until_it_settles() -> None:
    """A full window keeps its oldest key while that key's append is in flight, and
    while retries wait for it: a retry (alone or in a batch) gets its result and never
    appends it again (before, the key was evicted the moment it settled, and a retry
    that had waited for it found it free and appended it a second time)."""
    hold = HoldKey("a")
    dedup = Dedup(max_keys=2)
    chain = [*default_chain(sync_interval=None, dedup=dedup), hold]
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p0", interceptors=chain
    ) as wal:
        await wal.append(keyed("warm"))
        first = asyncio.ensure_future(wal.append(keyed("a")))
        await hold.holding.wait()
        for key in ("b", "c", "d"):
            await wal.append(keyed(key))
        assert len(dedup) == 4  # "warm" evicted; "a" in flight holds "b", "c" and "d"
        retry = asyncio.ensure_future(wal.append(keyed("a")))
        batch = asyncio.ensure_future(wal.append_many([keyed("a"), keyed("f")]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not retry.done()  # it waits for the append in flight
        assert not batch.done()  # so does the batch
        hold.release.set()
        async with asyncio.timeout(10):
            assert await retry == await first
            assert (await batch)[0] == await first
        await wal.append_many([keyed("e")])
        assert len(dedup) == 2  # the keys past the bound evicted once nobody waited
        log = await log_of(wal)
    assert keys_in(log) == Counter(["a", "b", "c", "d", "e", "f"])
