"""Exactly-once under cancellation and timeouts: a keyed append whose caller gave up is
settled by its own outcome, so the retry the README recommends (same key, after
``asyncio.timeout`` or a cancellation) never writes a second copy; the same for
transactions with an idempotency key, across restarts."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter

import _faulty
import pytest
from _chain_support import data, log_of, member
from _impatient import impatient_attempt

import walsvc
from interceptors import Dedup
from walsvc import AppendResult, MessageType, TxnState

_faulty.register()

#: ``make soak`` runs the properties longer.
SOAK = int(os.environ.get("WALSVC_SOAK", "1"))


async def _settle(wal: walsvc.WAL, message: walsvc.Message, rng: random.Random) -> AppendResult:
    """Append ``message`` as an impatient client would, retrying with the same key until
    one attempt answers."""
    while True:
        result = await impatient_attempt(
            rng, lambda: wal.append(message), deadlines=(0, 0.0001, 0.0005, 0.002)
        )
        if isinstance(result, AppendResult):
            return result


@pytest.mark.slow
async def test_keyed_retries_after_timeouts_and_cancellations_land_once(
    url: str, seed: random.Random
) -> None:
    """The property: producers append keyed messages (one at a time and in batches, and
    batches of counted keys, which Dedup holds as runs) under random deadlines and
    cancellations and retry each until answered; the log then holds every key exactly
    once, at the id every answer for it named."""
    async with await walsvc.open_wal(url, "p0") as wal:
        answers: dict[str, set[AppendResult]] = {}

        async def producer(p: int) -> None:
            rng = random.Random(seed.random())
            for k in range(60 * SOAK):
                key = f"p{p}-{k}"
                result = await _settle(wal, data(key.encode(), idempotency_key=key), rng)
                answers.setdefault(key, set()).add(result)
                if rng.random() < 0.5:  # and now and then a retry nobody needed
                    answers[key].add(await wal.append(data(key.encode(), idempotency_key=key)))

        async def settle_batch(batch: list[walsvc.Message], rng: random.Random) -> None:
            """Append ``batch`` under random deadlines until one attempt answers."""
            while True:
                try:
                    async with asyncio.timeout(rng.choice((0.0001, 0.001, None))):
                        results = await wal.append_many(batch)
                    break
                except TimeoutError:
                    continue
            for message, result in zip(batch, results, strict=True):
                assert message.idempotency_key is not None
                answers.setdefault(message.idempotency_key, set()).add(result)

        async def batcher() -> None:
            rng = random.Random(seed.random())
            for b in range(20):
                keys = [f"b{b}-{i}" for i in range(rng.randrange(1, 6))]
                await settle_batch([data(k.encode(), idempotency_key=k) for k in keys], rng)

        async def counter() -> None:  # one stem counted up: batches are Dedup's runs
            rng = random.Random(seed.random())
            n = 0
            for _ in range(30):
                size = rng.choice((1, 1, 2, 3, 5, 8))
                keys = [f"~c.{i:x}" for i in range(n, n + size)]
                n += size
                if size == 1:  # a single between runs: a key of the table
                    result = await _settle(wal, data(b"c", idempotency_key=keys[0]), rng)
                    answers.setdefault(keys[0], set()).add(result)
                    continue
                await settle_batch([data(b"c", idempotency_key=k) for k in keys], rng)

        await asyncio.gather(*(producer(p) for p in range(6)), batcher(), counter())
        log = await log_of(wal)
    stored = Counter(m.idempotency_key for m in log if m.idempotency_key)
    assert [k for k, n in stored.items() if n > 1] == []
    assert set(stored) == set(answers)
    where = {m.idempotency_key: m.message_id for m in log if m.idempotency_key}
    for key, results in answers.items():
        assert {r.message_id for r in results} == {where[key]}, key


async def test_a_cancelled_keyed_append_is_answered_to_its_retry(url: str) -> None:
    """Cancelled once the record is on its way to the log: the retry waits for that
    append's outcome instead of writing another copy (before: the key was released while
    the record still waited in the file WAL's group commit)."""
    async with await walsvc.open_wal(url, "p0") as wal:
        await wal.wait_ready()
        for i in range(20):
            key = f"k{i}"
            first = asyncio.ensure_future(wal.append(data(b"x", idempotency_key=key)))
            for _ in range(i % 4):
                await asyncio.sleep(0)
            first.cancel()
            retried = await wal.append(data(b"x", idempotency_key=key))
            await asyncio.gather(first, return_exceptions=True)
            if not first.cancelled():  # it finished before the cancel arrived
                assert first.result() == retried
        log = await log_of(wal)
    assert sorted(m.idempotency_key for m in log if m.idempotency_key) == [
        f"k{i}" for i in sorted(range(20), key=str)
    ]


async def test_a_blocked_key_is_resolved_by_a_retry_once_the_log_reads() -> None:
    """An ambiguous append whose resolution read failed blocks its key; a retry reads the
    log again (no reopen needed) and is answered once the read succeeds."""
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "q") as wal:
        await wal.append(data(b"ready"))
        await member(wal, Dedup).wait_rebuilt()
        _faulty.FaultyBackend.faults["q"] = ["lost-ack"]
        _faulty.FaultyBackend.unreadable.add("q")
        try:
            with pytest.raises(walsvc.AppendOutcomeUnknown, match="blocked"):
                await wal.append(data(b"x", idempotency_key="k"))
            with pytest.raises(walsvc.AppendOutcomeUnknown, match="blocked"):
                await wal.append(data(b"x", idempotency_key="k"))
        finally:
            _faulty.FaultyBackend.unreadable.discard("q")
        answered = await wal.append(data(b"x", idempotency_key="k"))
        assert await wal.append(data(b"x", idempotency_key="k")) == answered
        log = await log_of(wal)
    assert [m.message_id for m in log if m.idempotency_key == "k"] == [answered.message_id]


# -- transactions --------------------------------------------------------------------------


async def _order(wal: walsvc.WAL, key: str, items: int) -> walsvc.Txn:
    async with wal.txn("orders", idempotency_key=key) as txn:
        for i in range(items):
            await txn.append(data(b"%s/%d" % (key.encode(), i), vchannel="orders"))
    return txn


async def _written(wal: walsvc.WAL) -> list[walsvc.ImmutableMessage]:
    """The log without its TimeTicks (the timetick sync's timer may persist one at any
    moment)."""
    return [m for m in await log_of(wal) if m.type is not MessageType.TIME_TICK]


async def test_a_retried_transaction_whose_commit_landed_appends_nothing(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        first = await _order(wal, "order-1", 3)
        before = await _written(wal)
        again = await _order(wal, "order-1", 3)
        assert again.replayed
        assert not first.replayed
        assert again.state is TxnState.COMMITTED
        assert again.commit_result == first.commit_result
        assert again.begin_result == first.begin_result
        assert await _written(wal) == before
    async with await walsvc.open_wal(url, "p0") as wal:  # across a restart too
        third = await _order(wal, "order-1", 3)
        assert third.commit_result == first.commit_result
        log = await log_of(wal)
    commits = [m for m in log if m.type is MessageType.COMMIT_TXN]
    assert [m.idempotency_key for m in commits] == ["order-1"]


async def test_a_replay_answers_body_appends_with_the_first_run_results(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        async with wal.txn("orders", idempotency_key="o") as txn:
            bodies = [await txn.append(data(b"%d" % i, vchannel="orders")) for i in range(4)]
        async with wal.txn("orders", idempotency_key="o") as replay:
            again = await replay.append_many([data(b"%d" % i, vchannel="orders") for i in range(3)])
            again.append(await replay.append(data(b"3", vchannel="orders")))
            with pytest.raises(walsvc.InvalidArgument, match="4 body messages"):
                await replay.append(data(b"4", vchannel="orders"))
        assert again == bodies
        with pytest.raises(walsvc.TxnNotActive, match="cannot be rolled back"):
            await (await wal.begin_txn("orders", idempotency_key="o")).rollback()


async def test_two_open_transactions_with_one_key_commit_once(url: str) -> None:
    """Both began before either committed: the second commit becomes a rollback of its own
    transaction and is answered with the first commit's result; readers see one order."""
    async with await walsvc.open_wal(url, "p0") as wal:
        one = await wal.begin_txn("orders", idempotency_key="dup")
        two = await wal.begin_txn("orders", idempotency_key="dup")
        await one.append(data(b"one", vchannel="orders"))
        await two.append(data(b"two", vchannel="orders"))
        first, second = await asyncio.gather(one.commit(), two.commit())
        assert first == second
        latest = await wal.latest_message_id()
        delivered = []
        async with wal.read(timeticks=True) as scanner:
            async for message in scanner:
                delivered.append(message)
                if message.message_id >= latest:
                    break
        log = await log_of(wal)
    txns = [m for m in delivered if m.type is MessageType.TXN]
    assert [[b.payload for b in m.body] for m in txns] == [[b"one"]]
    rollbacks = [m for m in log if m.type is MessageType.ROLLBACK_TXN]
    assert [m.txn for m in rollbacks] == [two.context]


async def test_a_cancelled_commit_is_settled_for_the_retried_transaction(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        await wal.wait_ready()
        for i in range(10):
            key = f"t{i}"
            txn = await wal.begin_txn("orders", idempotency_key=key)
            await txn.append(data(b"x", vchannel="orders"))
            commit = asyncio.ensure_future(txn.commit())
            for _ in range(i % 3):
                await asyncio.sleep(0)
            commit.cancel()
            retried = await _order(wal, key, 1)
            await asyncio.gather(commit, return_exceptions=True)
            if retried.replayed and not commit.cancelled():
                assert commit.result() == retried.commit_result
        log = await log_of(wal)
    keys = Counter(m.idempotency_key for m in log if m.type is MessageType.COMMIT_TXN)
    assert keys == Counter({f"t{i}": 1 for i in range(10)})


async def test_a_key_names_one_message_or_one_transaction(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        await wal.append(data(b"m", vchannel="orders", idempotency_key="same"))
        with pytest.raises(walsvc.InvalidArgument, match="names a message"):
            await wal.begin_txn("orders", idempotency_key="same")
        await _order(wal, "other", 1)
        with pytest.raises(walsvc.InvalidArgument, match="names a transaction"):
            await wal.append(data(b"m", vchannel="orders", idempotency_key="other"))


async def test_a_body_with_a_key_of_its_own_is_refused_with_the_fix_named(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        async with wal.txn("orders") as txn:
            with pytest.raises(walsvc.InvalidMessage, match=r"give the transaction one"):
                await txn.append(data(b"x", vchannel="orders", idempotency_key="k"))


async def test_append_many_sends_bodies_down_in_batches(url: str) -> None:
    """A large transaction's bodies go down as a few batches (contiguous in the log; only
    a TimeTick may come between two) instead of one append (one group commit) per body."""
    async with await walsvc.open_wal(url, "p0") as wal:
        async with wal.txn("orders") as txn:
            results = await txn.append_many(
                [data(b"%d" % i, vchannel="orders") for i in range(3000)]
            )
        seqs = [r.message_id.seq for r in results]
        gaps = [i for i in range(1, 3000) if seqs[i] != seqs[i - 1] + 1]
        assert all(i % 1024 == 0 for i in gaps), gaps
        latest = await wal.latest_message_id()
        async with wal.read(timeticks=True) as scanner:
            async for message in scanner:
                if message.type is MessageType.TXN:
                    assert [b.payload for b in message.body] == [b"%d" % i for i in range(3000)]
                    break
                assert message.message_id < latest
