"""Properties of the default interceptor chain under random, concurrent workloads with
transactions, expiries, DDL, retries and restarts (hypothesis; seeded, reproducible):

(a) timeticks strictly increase in log order, across restarts;
(b) producers retrying at random (across restarts and ambiguous failures too) leave
    every idempotency key exactly once in the log;
(c) a reader resuming from any message's (last_confirmed_id, timetick) sees every message
    with a greater tick, including the begin and body of every transaction open then
    (the Milvus #45088 path).
The clock is injected and the timetick sync driven by hand: nothing waits for a timer.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from pathlib import Path
from typing import Any

import _faulty
import pytest
from _chain_support import FakeClock, open_manual, whole_log
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import walsvc
from interceptors import TimetickSync
from walsvc import DeliverPolicy, ImmutableMessage, Message, MessageType

_faulty.register()

_VCHANNELS = ("v1", "v2")
_SLOTS = 3

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(_VCHANNELS)),
        st.tuples(st.just("begin"), st.integers(0, _SLOTS - 1)),
        st.tuples(st.just("body"), st.integers(0, _SLOTS - 1)),
        st.tuples(st.just("commit"), st.integers(0, _SLOTS - 1)),
        st.tuples(st.just("rollback"), st.integers(0, _SLOTS - 1)),
        st.tuples(st.just("ddl"), st.sampled_from(_VCHANNELS)),
        st.tuples(st.just("advance"), st.integers(1, 3000)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("restart"), st.integers(-5000, 5000)),
    ),
    min_size=1,
    max_size=40,
)
# How many consecutive operations run concurrently.
groups = st.lists(st.integers(1, 4), min_size=40, max_size=40)


async def _run(url: str, program: list[tuple[str, Any]], sizes: list[int]) -> None:
    clock = FakeClock()
    wal = await open_manual(url, clock, pchannel="p")
    txns: dict[int, walsvc.Txn] = {}

    async def one(op: str, arg: Any) -> None:
        try:
            if op == "append":
                await wal.append(Message(payload=b"d", vchannel=arg))
            elif op == "begin":
                txns[arg] = await wal.begin_txn(_VCHANNELS[arg % 2], keepalive=2.0)
            elif op in ("body", "commit", "rollback") and arg in txns:
                txn = txns[arg]
                if op == "body":
                    await txn.append(Message(payload=b"b", vchannel=txn.vchannel))
                elif op == "commit":
                    await txn.commit()
                else:
                    await txn.rollback()
            elif op == "ddl":
                await wal.append(
                    Message(payload=b"", vchannel=arg, type=MessageType.CREATE_PARTITION)
                )
        except (walsvc.TxnError, walsvc.WALClosed):
            pass  # expired, aborted, ended or closed: the log must still hold up

    position = 0
    for size in sizes:
        batch = program[position : position + size]
        position += size
        if not batch:
            break
        concurrent = []
        for op, arg in batch:
            if op == "advance":
                clock.ms += arg
            elif op == "sync":
                sync = next(m for m in wal.interceptors if isinstance(m, TimetickSync))
                await sync.sync_once()
            elif op == "restart":
                await asyncio.gather(*concurrent)
                concurrent = []
                await wal.aclose()
                clock.ms += arg  # the wall clock may step back across a restart
                wal = await open_manual(url, clock, pchannel="p")
                txns.clear()
            else:
                concurrent.append(asyncio.ensure_future(one(op, arg)))
        await asyncio.gather(*concurrent)
    await wal.aclose()


def _check_log(log: list[ImmutableMessage]) -> None:
    # (a) log order is tick order.
    ticks = [m.timetick for m in log]
    assert all(a < b for a, b in itertools.pairwise(ticks)), ticks
    # (c) from any message's last-confirmed id, a reader sees what it must.
    begins: dict[int, ImmutableMessage] = {}
    ends: dict[int, ImmutableMessage] = {}
    bodies: dict[int, list[ImmutableMessage]] = {}
    for m in log:
        if m.txn is None:
            continue
        if m.type is MessageType.BEGIN_TXN:
            begins[m.txn.txn_id] = m
        elif m.type in (MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN):
            ends[m.txn.txn_id] = m
        else:
            bodies.setdefault(m.txn.txn_id, []).append(m)
    for m in log:
        if m.last_confirmed_id is None:
            assert m is log[0] or m.type is MessageType.TIME_TICK, m
            continue
        assert m.last_confirmed_id < m.message_id, m
        for txn_id, begin in begins.items():
            end = ends.get(txn_id)
            if begin.timetick < m.timetick and end is not None and end.timetick > m.timetick:
                # Open at m and ended later: its begin and body must be readable from m.
                needed = [begin, *bodies.get(txn_id, [])]
                assert all(m.last_confirmed_id <= n.message_id for n in needed), (m, begin)


async def _check_resume(url: str, log: list[ImmutableMessage], picks: list[int]) -> None:
    """Read from (last_confirmed_id, timetick) checkpoints for real."""
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        for pick in picks:
            m = log[pick % len(log)]
            if m.last_confirmed_id is None:
                continue
            expected = [n.message_id for n in log if n.message_id >= m.last_confirmed_id]
            got = []
            start = DeliverPolicy.start_from(m.last_confirmed_id)
            async with wal.read(start, raw=True) as scanner:
                async for n in scanner:
                    got.append(n.message_id)
                    if n.message_id == log[-1].message_id:
                        break
            assert got == expected


_settings = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@_settings
@given(program=ops, sizes=groups, picks=st.lists(st.integers(0, 10_000), max_size=3))
async def test_ticks_and_resume_points_hold_on_memory(
    program: list[tuple[str, Any]], sizes: list[int], picks: list[int]
) -> None:
    url = f"memory://{uuid.uuid4().hex}"
    await _run(url, program, sizes)
    log = await whole_log(url, "p")
    _check_log(log)
    await _check_resume(url, log, picks)


@settings(_settings, max_examples=15)
@given(program=ops, sizes=groups)
# Found in CI: two transactions expiring at one tick; the first RollbackTxn dropped the
# second's pin before the second's RollbackTxn was written.
@example(program=[("begin", 0), ("begin", 0), ("advance", 2001), ("sync", 0)], sizes=[1] * 40)
async def test_ticks_and_resume_points_hold_on_file(
    tmp_path: Path, program: list[tuple[str, Any]], sizes: list[int]
) -> None:
    url = f"file://{tmp_path / uuid.uuid4().hex}"
    await _run(url, program, sizes)
    _check_log(await whole_log(url, "p"))


@_settings
@given(
    attempts=st.lists(
        st.tuples(
            st.integers(0, 9),  # which key
            st.sampled_from(["ok", "ok", "lost-ack", "lost-write", "unavailable"]),
            st.booleans(),  # restart before this attempt
        ),
        min_size=1,
        max_size=30,
    )
)
async def test_retried_keys_land_exactly_once(attempts: list[tuple[int, str, bool]]) -> None:
    name = uuid.uuid4().hex
    url = f"{_faulty.SCHEME}://{name}"
    clock = FakeClock()
    wal = await open_manual(url, clock, pchannel="p")
    acked: dict[str, walsvc.AppendResult] = {}
    try:
        for key_no, fault, restart in attempts:
            if restart:
                await wal.aclose()
                wal = await open_manual(url, clock, pchannel="p")
            key = walsvc.producer_key("producer", key_no)
            _faulty.FaultyBackend.faults["p"] = [fault]
            try:
                result = await wal.append(Message(payload=b"k", vchannel="v1", idempotency_key=key))
            except (walsvc.AppendOutcomeUnknown, walsvc.BackendUnavailable):
                continue  # the producer will retry this key later
            finally:
                _faulty.FaultyBackend.faults["p"] = []
            if key in acked:
                assert result == acked[key]  # a retry gets the original result
            acked[key] = result
    finally:
        await wal.aclose()
    log = await whole_log(url, "p")
    keys = [m.idempotency_key for m in log if m.idempotency_key is not None]
    assert len(keys) == len(set(keys)), keys
    assert set(acked) <= set(keys)
    for key, result in acked.items():
        (landed,) = [m for m in log if m.idempotency_key == key]
        assert landed.message_id == result.message_id


@pytest.mark.parametrize("scheme", ["memory"])
async def test_a_txn_open_across_a_checkpoint_is_replayed_whole(scheme: str) -> None:
    """The #45088 path, spelled out: a reader that stops in the middle of an open
    transaction and resumes from its checkpoint gets the whole transaction, committed."""
    url = f"{scheme}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p") as wal:
        txn = await wal.begin_txn("v1")
        await txn.append(Message(payload=b"body", vchannel="v1"))
        between = await wal.append(Message(payload=b"between", vchannel="v2"))
        committed = await txn.commit()
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        resume = walsvc.Checkpoint(between.last_confirmed_id, between.timetick)
        async with wal.read(DeliverPolicy.from_checkpoint(resume)) as scanner:
            first = await anext(scanner)
    assert first.type is MessageType.TXN
    assert first.message_id == committed.message_id
    assert [(m.payload, m.timetick) for m in first.body] == [(b"body", committed.timetick)]
