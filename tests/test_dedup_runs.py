"""Dedup's runs: a batch of counted keys (a remote producer's ``~<id>.<hex>``, or
``walsvc.producer_key``'s ``<id>#<n>``) is held as one run, and the window answers for
its keys exactly as it does for keys held one by one: resends, keys in flight, other
vchannels, failures, ambiguous outcomes, the bound and recall."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Sequence

import _faulty
import pytest
from _chain_support import HoldBatches, data, log_of, member

import interceptors
import walsvc
from interceptors import Dedup
from walsvc import AppendResult, InvalidArgument, Message
from walsvc.core._chain import AppendBatchNext, AppendNext

_faulty.register()


def _remote_keys(first: int, count: int, producer: str = "~0123456789abcdef.") -> list[str]:
    return [f"{producer}{n:x}" for n in range(first, first + count)]


def _batch(
    keys: Sequence[str], vchannels: Sequence[str] = ("v1", "v2", "v3"), start: int = 0
) -> list[Message]:
    """Messages with ``keys``, the key at ``i`` on ``vchannels[(start + i) % 3]``: a
    slice of a batch starting at ``start`` gets the same messages."""
    return [
        data(b"%d" % i, vchannel=vchannels[(start + i) % len(vchannels)], idempotency_key=key)
        for i, key in enumerate(keys)
    ]


def _chain(*extra: object, max_keys: int = 100_000) -> list[walsvc.abc.ChainMember]:
    chain = interceptors.default_chain(sync_interval=None, dedup=Dedup(max_keys=max_keys))
    return [*chain, *extra]  # type: ignore[list-item]


def _keyed(log: Sequence[walsvc.ImmutableMessage]) -> list[tuple[str, str | None]]:
    return [(m.vchannel, m.idempotency_key) for m in log if m.idempotency_key]


@pytest.mark.parametrize("form", ["remote", "producer_key"])
async def test_a_counted_batch_is_one_run_and_its_keys_are_answered_from_it(
    url: str, form: str
) -> None:
    """A batch of 50 counted keys is one run, not 50 slots; resent whole, in part, mixed
    with new keys or one by one, each key is answered with its first result and nothing
    lands twice; the same key on another vchannel is another key."""
    if form == "remote":
        keys = _remote_keys(1, 80)
    else:
        keys = [walsvc.producer_key("spark", n) for n in range(80)]
    async with await walsvc.open_wal(url, "p0", interceptors=_chain()) as wal:
        dedup = member(wal, Dedup)
        first = await wal.append_many(_batch(keys[:50]))
        assert (dedup._keys.runs.keys, len(dedup._keys.slots), len(dedup)) == (50, 0, 50)
        assert await wal.append_many(_batch(keys[:50])) == first
        overlapping = await wal.append_many(_batch(keys[25:75], start=25))
        one_by_one = [await wal.append(m) for m in _batch(keys[:50])[::7]]
        coalesced = await asyncio.gather(*(wal.append(m) for m in _batch(keys[:50])[1::7]))
        elsewhere = await wal.append(data(b"x", vchannel="v9", idempotency_key=keys[0]))
        log = await log_of(wal)
    assert overlapping[:25] == first[25:]
    assert one_by_one == first[::7]
    assert coalesced == first[1::7]
    assert elsewhere.message_id not in {r.message_id for r in first}
    expected = [(m.vchannel, m.idempotency_key) for m in _batch(keys[:50])]
    expected += [(m.vchannel, m.idempotency_key) for m in _batch(keys[25:75], start=25)]
    assert _keyed(log) == [*expected[:50], *expected[75:], ("v9", keys[0])]
    keyed_ids = [m.message_id for m in log if m.idempotency_key]
    assert [r.message_id for r in overlapping[25:]] == keyed_ids[50:75]


async def test_a_key_of_a_run_on_another_vchannel_is_not_the_runs() -> None:
    """A resent batch whose messages moved to other vchannels is new keys: appended."""
    keys = _remote_keys(7, 4)
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain()
    ) as wal:
        first = await wal.append_many(_batch(keys, ("a", "b")))
        moved = await wal.append_many(_batch(keys, ("b", "a")))
        log = await log_of(wal)
    assert {r.message_id for r in first}.isdisjoint(r.message_id for r in moved)
    assert len(_keyed(log)) == 8


async def test_a_run_resent_while_in_flight_waits_for_its_outcome() -> None:
    """Resends of a run in flight (whole, a key alone, mixed with new keys) wait for it
    and are answered with its results."""
    hold = HoldBatches()
    keys = _remote_keys(1, 30)
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain(hold)
    ) as wal:
        await wal.wait_ready()
        await member(wal, Dedup).wait_rebuilt()
        first = asyncio.ensure_future(wal.append_many(_batch(keys[:20])))
        await hold.holding.wait()
        again = asyncio.ensure_future(wal.append_many(_batch(keys[:20])))
        alone = asyncio.ensure_future(wal.append(_batch(keys[:20])[5]))
        mixed = asyncio.ensure_future(wal.append_many(_batch(keys[10:30], start=10)))
        await asyncio.sleep(0.01)
        assert not any(f.done() for f in (again, alone, mixed))
        hold.release.set()
        results = await first
        assert await again == results
        assert await alone == results[5]
        assert (await mixed)[:10] == results[10:]
        log = await log_of(wal)
    assert [k for _, k in _keyed(log)] == keys


class _FailBatchesOnce:
    """An interceptor whose first batch fails with ``InvalidArgument``, before anything
    is written."""

    def __init__(self) -> None:
        self.failed = False

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        if not self.failed:
            self.failed = True
            raise InvalidArgument("refused before writing")
        return await call_next(messages)


async def test_a_run_that_wrote_nothing_is_released_and_its_retry_appends() -> None:
    keys = _remote_keys(1, 10)
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain(_FailBatchesOnce())
    ) as wal:
        dedup = member(wal, Dedup)
        with pytest.raises(InvalidArgument):
            await wal.append_many(_batch(keys))
        assert len(dedup) == 0
        retried = await wal.append_many(_batch(keys))
        assert await wal.append_many(_batch(keys)) == retried
        log = await log_of(wal)
    assert [k for _, k in _keyed(log)] == keys


async def test_an_ambiguous_run_is_resolved_key_by_key() -> None:
    """A run whose append's outcome is unknown moves into the table and is looked up in
    the log: found, its keys answer; not found, they are released and a retry appends."""
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "b", interceptors=_chain()) as wal:
        await wal.wait_ready()
        dedup = member(wal, Dedup)
        await dedup.wait_rebuilt()
        landed_keys, lost_keys = _remote_keys(1, 3), _remote_keys(4, 3)
        _faulty.FaultyBackend.faults["b"] = ["lost-ack"]
        landed = await wal.append_many(_batch(landed_keys))
        assert (dedup._keys.runs.keys, len(dedup._keys.slots)) == (0, 3)  # in the table
        assert await wal.append_many(_batch(landed_keys)) == landed
        _faulty.FaultyBackend.faults["b"] = ["lost-write"]
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await wal.append_many(_batch(lost_keys))
        retried = await wal.append_many(_batch(lost_keys))
        assert dedup._keys.runs.keys == 3  # a run again
        assert await wal.append_many(_batch(lost_keys)) == retried
        log = await log_of(wal)
    assert [k for _, k in _keyed(log)] == [*landed_keys, *lost_keys]


async def test_the_bound_counts_the_keys_of_runs_and_recall_finds_what_it_dropped() -> None:
    """The window keeps at most ``max_keys`` keys, runs' and the table's together,
    dropping the oldest (part of a run, too); a dropped key is recalled from the log."""
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain(max_keys=120)
    ) as wal:
        dedup = member(wal, Dedup)
        batches = [_batch(_remote_keys(1 + 50 * i, 50)) for i in range(5)]
        results: list[AppendResult] = []
        for i, batch in enumerate(batches):
            results += await wal.append_many(batch)
            await wal.append(data(b"t", idempotency_key=f"table-{i}"))  # one in the table
            assert len(dedup) == min(120, 51 * (i + 1))
        window = dedup._keys
        kept = [m for b in batches for m in b][-116:]  # and 4 table keys
        assert all(window.get(f"{m.vchannel}\0{m.idempotency_key}") for m in kept)
        dropped = batches[0][0]
        assert window.get(f"{dropped.vchannel}\0{dropped.idempotency_key}") is None
        assert window.forgotten_below > results[0].timetick
        recalled = await wal.recall_keys([(dropped.vchannel, dropped.idempotency_key)], 0)
        assert recalled == [results[0]]


async def test_a_run_a_retry_waits_on_outlives_the_bound_until_it_is_read() -> None:
    """A settled run over the bound stays while a resend of it is still to read its
    results (held keys): the resend is answered, not appended again."""
    hold = HoldBatches()
    keys = _remote_keys(1, 5)
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain(hold, max_keys=3)
    ) as wal:
        await wal.wait_ready()
        await member(wal, Dedup).wait_rebuilt()
        first = asyncio.ensure_future(wal.append_many(_batch(keys)))
        await hold.holding.wait()
        again = asyncio.ensure_future(wal.append_many(_batch(keys)))
        await asyncio.sleep(0.01)
        hold.release.set()
        assert await again == await first
        log = await log_of(wal)
    assert [k for _, k in _keyed(log)] == keys


@pytest.mark.parametrize("vchannels", [("v1", "v2"), ("v\0a", "v\0b")])
async def test_a_table_key_keeps_a_batch_from_being_a_run(
    url: str, vchannels: tuple[str, str]
) -> None:
    """A batch one of whose counted keys the table holds (appended alone first) is not
    a run: that key is answered, the rest appended (vchannels with a NUL too, whose
    window keys are tuples)."""
    keys = _remote_keys(1, 10)
    async with await walsvc.open_wal(url, "p0", interceptors=_chain()) as wal:
        alone = await wal.append(_batch(keys, vchannels)[4])
        batch = await wal.append_many(_batch(keys, vchannels))
        log = await log_of(wal)
    assert batch[4] == alone
    assert sorted(k for _, k in _keyed(log) if k) == sorted(keys)


async def test_the_keys_of_runs_are_rebuilt_from_the_log_on_open(tmp_path: object) -> None:
    url = f"file://{tmp_path}"
    keys = _remote_keys(1, 20)
    async with await walsvc.open_wal(url, "p0", interceptors=_chain()) as wal:
        first = await wal.append_many(_batch(keys))
    async with await walsvc.open_wal(url, "p0", interceptors=_chain()) as wal:
        assert await wal.append_many(_batch(keys)) == first
        assert await wal.append(_batch(keys)[3]) == first[3]
        log = await log_of(wal)
    assert [k for _, k in _keyed(log)] == keys


async def test_concurrent_appends_of_new_counted_keys_are_one_run() -> None:
    """Single appends of a run of new counted keys taken together (a remote producer's
    frame, coalesced on the node) are claimed and settled as one run, and answered
    from it as a batch's are."""
    keys = _remote_keys(1, 20)
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain()
    ) as wal:
        dedup = member(wal, Dedup)
        await wal.wait_ready()
        await dedup.wait_rebuilt()
        first = await asyncio.gather(*(wal.append(m) for m in _batch(keys)))
        assert (dedup._keys.runs.keys, len(dedup._keys.slots)) == (20, 0)
        assert await asyncio.gather(*(wal.append(m) for m in _batch(keys))) == first
        assert await wal.append_many(_batch(keys[5:15], start=5)) == first[5:15]
        assert await wal.append(_batch(keys)[7]) == first[7]
        log = await log_of(wal)
    assert [k for _, k in _keyed(log)] == keys
    assert [m.message_id for m in log if m.idempotency_key] == [r.message_id for r in first]


@pytest.mark.parametrize("fault", ["refused", "lost-ack", "lost-write", "too-large"])
async def test_a_coalesced_run_that_fails_keeps_each_promise(fault: str) -> None:
    """A coalesced run whose batch fails: refused before writing, each caller gets the
    error and its key is free; landed with its acknowledgement lost, each gets its
    result from the log (the keys move to the table); not written, each learns the
    outcome is unknown and its key is free; one message too large, only it fails. A
    retry of every key is answered for what landed and appends the rest once."""
    keys = _remote_keys(1, 8)
    payloads = [b"L" * 8192 if fault == "too-large" and i == 3 else b"s" for i in range(8)]
    messages = [
        data(p, vchannel=f"v{i % 3}", idempotency_key=k)
        for i, (p, k) in enumerate(zip(payloads, keys, strict=True))
    ]
    extra = [_FailBatchesOnce()] if fault == "refused" else []
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(
        name, "c", interceptors=_chain(*extra), max_message_size=4096
    ) as wal:
        dedup = member(wal, Dedup)
        await wal.wait_ready()
        await dedup.wait_rebuilt()
        if fault in ("lost-ack", "lost-write"):
            _faulty.FaultyBackend.faults["c"] = [fault]
        outcomes = await asyncio.gather(*(wal.append(m) for m in messages), return_exceptions=True)
        expected_error = {
            "refused": InvalidArgument,
            "lost-write": walsvc.AppendOutcomeUnknown,
        }.get(fault)
        if expected_error is not None:
            assert all(isinstance(o, expected_error) for o in outcomes), outcomes
            assert len(dedup) == 0  # every key is free again
        elif fault == "lost-ack":
            assert all(isinstance(o, AppendResult) for o in outcomes), outcomes
            assert (dedup._keys.runs.keys, len(dedup._keys.slots)) == (0, 8)
        else:
            assert isinstance(outcomes[3], walsvc.MessageTooLarge)
            assert all(isinstance(o, AppendResult) for i, o in enumerate(outcomes) if i != 3)
        messages[3] = data(b"s", vchannel="v0", idempotency_key=keys[3])
        retried = await asyncio.gather(*(wal.append(m) for m in messages))
        for outcome, result in zip(outcomes, retried, strict=True):
            if isinstance(outcome, AppendResult):
                assert result == outcome
        assert await asyncio.gather(*(wal.append(m) for m in messages)) == retried
        log = await log_of(wal)
    assert sorted(k for _, k in _keyed(log)) == sorted(keys)  # each once
    where = {m.idempotency_key: m.message_id for m in log}
    assert [where[k] for k in keys] == [r.message_id for r in retried]


class _LosesALastResultOnce:
    """An interceptor whose first batch is written whole but answered with one result
    too few: the chain's answer does not say what of the batch landed."""

    def __init__(self) -> None:
        self.lost = False

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        results = await call_next(messages)
        if not self.lost:
            self.lost = True
            return results[:-1]
        return results


@pytest.mark.parametrize("keys_form", ["run", "table"])
@pytest.mark.parametrize("how", ["append_many", "concurrent appends"])
async def test_a_batch_answered_with_a_wrong_count_is_resolved_from_the_log(
    keys_form: str, how: str
) -> None:
    """A batch whose chain returns a result too few (a broken interceptor) is treated as
    an append of unknown outcome: its keys are looked up in the log, where every message
    landed, so each caller gets its message's result; retries append nothing."""
    keys = _remote_keys(1, 8) if keys_form == "run" else [uuid.uuid4().hex for _ in range(8)]
    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain(_LosesALastResultOnce())
    ) as wal:
        await wal.wait_ready()
        await member(wal, Dedup).wait_rebuilt()
        if how == "append_many":
            first = await wal.append_many(_batch(keys))
        else:
            first = list(await asyncio.gather(*(wal.append(m) for m in _batch(keys))))
        assert await wal.append_many(_batch(keys)) == first
        log = await log_of(wal)
    where = {m.idempotency_key: m.message_id for m in log}
    assert [k for _, k in _keyed(log)] == keys  # each once
    assert [where[k] for k in keys] == [r.message_id for r in first]


#: ``WALSVC_SOAK=N`` (``make soak``): N times the random schedule's seeds.
SOAK = int(os.environ.get("WALSVC_SOAK", "1"))
#: What the random schedule adds to a message's vchannel: mostly nothing.
_SUFFIXES = ("", "", "", "+", "\0")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3 * SOAK))
async def test_random_resends_of_runs_land_each_key_once(seed: int) -> None:
    """Seeded rounds of concurrent appends of counted keys: batches of new, known and
    overlapping ranges of several producers, singles, ranges appended one by one at
    once (a coalesced batch, as a remote producer's frame), keys on other vchannels (one with
    a NUL: a tuple window key), with a batch now and then held in flight. Every
    (vchannel, key) lands once, and every answer for it is its first result."""
    rng = random.Random(seed)
    hold = HoldBatches()
    hold.release.set()
    producers = ["~aaaaaaaaaaaaaaaa.", "~bbbbbbbbbbbbbbbb.", "spark#"]
    answers: dict[tuple[str, str], set[AppendResult]] = {}

    def message(producer: str, n: int) -> Message:
        key = f"{producer}{n:x}" if producer.endswith(".") else f"{producer}{n}"
        return data(
            b"x",
            vchannel=f"v{(n * 7 + len(producer)) % 3}" + rng.choice(_SUFFIXES),
            idempotency_key=key,
        )

    async def note(call: asyncio.Future[object], messages: Sequence[Message]) -> None:
        outcome = await call
        results = outcome if isinstance(outcome, list) else [outcome]
        for m, r in zip(messages, results, strict=True):
            assert m.idempotency_key is not None
            answers.setdefault((m.vchannel, m.idempotency_key), set()).add(r)

    async with await walsvc.open_wal(
        f"memory://runs-{uuid.uuid4().hex[:8]}", "p0", interceptors=_chain(hold, max_keys=10_000)
    ) as wal:
        await wal.wait_ready()
        await member(wal, Dedup).wait_rebuilt()
        for _ in range(60):
            calls = []
            if rng.random() < 0.2:
                hold.release.clear()
                asyncio.get_running_loop().call_later(0.002, hold.release.set)
            for _ in range(rng.randint(1, 5)):
                producer = rng.choice(producers)
                first = rng.randint(0, 300)
                messages = [message(producer, n) for n in range(first, first + rng.randint(1, 40))]
                form = rng.random()
                if form < 0.3:
                    single = rng.choice(messages)
                    calls.append(note(asyncio.ensure_future(wal.append(single)), [single]))
                elif form < 0.5:  # a remote producer's frame: one coalesced batch
                    calls += [note(asyncio.ensure_future(wal.append(m)), [m]) for m in messages]
                else:
                    calls.append(note(asyncio.ensure_future(wal.append_many(messages)), messages))
            await asyncio.gather(*calls)
        log = await log_of(wal)
    landed = _keyed(log)
    assert len(landed) == len(set(landed))
    assert set(landed) == set(answers)
    assert all(len(results) == 1 for results in answers.values())
