"""Transactions: begin/body/commit in the log, rollback, misuse, expiry by timetick,
commit waiting for bodies. Time is an injected clock; no test sleeps for a timer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import _faulty
import pytest
from _chain_support import FakeClock, data, log_of, member, open_manual

import interceptors
import scanners
import walsvc
from interceptors import TimetickSync, Transactions
from walsvc import AppendResult, Message, MessageType
from walsvc.core._chain import AppendNext
from walsvc.testing import memory_wal

_faulty.register()


async def test_a_transaction_is_begin_body_commit_in_the_log(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        async with wal.txn("v1") as txn:
            body = [await txn.append(data(b"b%d" % i)) for i in range(3)]
        assert txn.state is walsvc.TxnState.COMMITTED
        assert txn.commit_result is not None
        log = await log_of(wal)
    mine = [m for m in log if m.txn is not None]
    assert [m.type for m in mine] == [
        MessageType.BEGIN_TXN,
        MessageType.INSERT,
        MessageType.INSERT,
        MessageType.INSERT,
        MessageType.COMMIT_TXN,
    ]
    assert {m.txn for m in mine} == {txn.context}
    assert [m.message_id for m in mine[1:4]] == [r.message_id for r in body]
    # While the transaction was open, every message pointed back at (or before) its begin.
    begin = mine[0]
    for message in mine[1:]:
        assert message.last_confirmed_id is not None
        assert message.last_confirmed_id < begin.message_id


async def test_an_error_in_the_block_rolls_back(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        txn = None

        async def failing_block() -> None:
            nonlocal txn
            async with wal.txn("v1") as txn:
                await txn.append(data(b"b"))
                raise KeyError("boom")

        with pytest.raises(KeyError):
            await failing_block()
        assert txn is not None
        assert txn.state is walsvc.TxnState.ROLLED_BACK
        log = await log_of(wal)
    assert log[-1].type is MessageType.ROLLBACK_TXN
    assert log[-1].txn == txn.context


async def test_misuse_of_a_transaction_gets_typed_errors() -> None:
    async with await memory_wal() as wal:
        txn = await wal.begin_txn("v1")
        with pytest.raises(walsvc.InvalidMessage, match="vchannel"):
            await txn.append(data(b"x", vchannel="v2"))
        with pytest.raises(walsvc.InvalidMessage, match="cannot be part"):
            await txn.append(data(b"x", type=MessageType.CREATE_COLLECTION))
        with pytest.raises(walsvc.InvalidMessage):
            await txn.append(data(b"x", idempotency_key="k"))
        await txn.commit()
        with pytest.raises(walsvc.TxnNotActive):
            await txn.append(data(b"x"))
        with pytest.raises(walsvc.TxnNotActive):
            await txn.commit()
        with pytest.raises(walsvc.TxnNotActive):
            await txn.rollback()
        for bad in (0, -1, "10", float("inf")):
            with pytest.raises(walsvc.InvalidArgument):
                await wal.begin_txn("v1", keepalive=bad)  # type: ignore[arg-type]


async def test_unknown_transactions_are_refused() -> None:
    transactions = Transactions()
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=[transactions]
    ) as wal:
        await wal.append(data(b"ready"))  # binds the interceptors

        async def never(message: Message) -> AppendResult:
            raise AssertionError("must not reach the log")

        forged = data(b"x", txn=walsvc.TxnContext(12345, 1000))
        with pytest.raises(walsvc.UnknownTxn):
            await transactions.do_append(forged, never)
        ended = await wal.begin_txn("v1")
        await ended.rollback()
        body = data(b"x", txn=ended.context)
        with pytest.raises(walsvc.TxnNotActive, match="rolled back"):
            await transactions.do_append(body, never)


async def test_an_idle_transaction_expires_by_timetick(url: str, clock: FakeClock) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        txn = await wal.begin_txn("v1", keepalive=1.0)
        clock.ms += 900
        await txn.append(data(b"renews"))  # keepalive now runs to +1.9 s
        clock.ms += 900
        await sync.sync_once()
        await txn.append(data(b"still open"))
        clock.ms += 1001
        await sync.sync_once()  # a tick past the keepalive: rolled back
        with pytest.raises(walsvc.TxnExpired, match="expired"):
            await txn.append(data(b"late"))
        with pytest.raises(walsvc.TxnExpired):
            await txn.commit()
    # Closing waited for the RollbackTxn being written in the background.
    async with await walsvc.open_wal(url, "p0", read_only=True) as wal:
        log = await log_of(wal)
    mine = [m for m in log if m.txn == txn.context]
    assert [m.type for m in mine][-1] is MessageType.ROLLBACK_TXN
    assert len(mine) == 4  # begin, two bodies, rollback


async def test_a_transaction_stays_pinned_until_its_rollback_is_in_the_log(
    url: str, clock: FakeClock
) -> None:
    # Two transactions expire at the same tick; their RollbackTxns are written one after
    # the other. The first RollbackTxn is appended while the second transaction is still
    # open in the log, so its last-confirmed id must not pass the second's BeginTxn
    # (found by the interceptor property test: the pin was dropped at expiry).
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        first = await wal.begin_txn("v1", keepalive=2.0)
        second = await wal.begin_txn("v1", keepalive=2.0)
        clock.ms += 2001
        await sync.sync_once()
    async with await walsvc.open_wal(url, "p0", read_only=True) as wal:
        log = await log_of(wal)
    begins = {m.txn: m for m in log if m.type is MessageType.BEGIN_TXN}
    rollbacks = [m for m in log if m.type is MessageType.ROLLBACK_TXN]
    assert {m.txn for m in rollbacks} == {first.context, second.context}
    earlier, later = rollbacks
    assert earlier.last_confirmed_id is not None
    assert earlier.last_confirmed_id <= begins[later.txn].message_id


async def test_commit_waits_for_in_flight_body_appends() -> None:
    gate = asyncio.Event()
    order: list[str] = []

    class HoldBodies:
        async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
            if message.txn is not None and message.type is MessageType.INSERT:
                await gate.wait()
            result = await call_next(message)
            order.append(message.type.name)
            return result

    chain = [*interceptors.default_chain(sync_interval=None), HoldBodies()]
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=chain
    ) as wal:
        txn = await wal.begin_txn("v1")
        body = asyncio.ensure_future(txn.append(data(b"slow")))
        await asyncio.sleep(0)
        commit = asyncio.ensure_future(txn.commit())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not commit.done()
        gate.set()
        await body
        await commit
    assert order == ["BEGIN_TXN", "INSERT", "COMMIT_TXN"]


async def test_a_failed_body_append_aborts_the_transaction() -> None:
    name = uuid.uuid4().hex
    async with await walsvc.open_wal(f"{_faulty.SCHEME}://{name}", "p") as wal:
        txn = await wal.begin_txn("v1")
        _faulty.FaultyBackend.faults["p"] = ["lost-write"]
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await txn.append(data(b"x"))
        with pytest.raises(walsvc.TxnError):
            await txn.commit()
    async with await walsvc.open_wal(f"{_faulty.SCHEME}://{name}", "p", read_only=True) as wal:
        log = await log_of(wal)
    assert log[-1].type is MessageType.ROLLBACK_TXN


async def test_filters_still_see_system_messages() -> None:
    async with await memory_wal() as wal:
        async with wal.txn("v1") as txn:
            await txn.append(data(b"x"))
        selected: Sequence[walsvc.Filter] = [
            scanners.vchannel("v1"),
            scanners.types(MessageType.DELETE),
        ]
        async with wal.read(filters=selected, raw=True) as scanner:
            raw = [await anext(scanner) for _ in range(3)]
        async with wal.read(filters=selected, timeticks=True) as scanner:
            assembled = [await anext(scanner) for _ in range(2)]
    assert [m.type for m in raw] == [
        MessageType.TIME_TICK,
        MessageType.BEGIN_TXN,
        MessageType.COMMIT_TXN,
    ]
    # The committed transaction is delivered (a system message), its INSERT body is not.
    assert [(m.type, m.body) for m in assembled] == [
        (MessageType.TIME_TICK, ()),
        (MessageType.TXN, ()),
    ]


async def test_a_transaction_left_open_by_an_earlier_writer_is_rolled_back_on_open(
    url: str,
) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        finished = await wal.begin_txn("v1")
        await finished.append(data(b"kept"))
        await finished.commit()
        left = await wal.begin_txn("v2")
        body = await left.append(data(b"orphan", vchannel="v2"))
        # Closing ends the handle without writing: the log has the begin and body only.
    async with await walsvc.open_wal(url, "p0") as wal:
        await wal.wait_ready()
        assert member(wal, Transactions).rolled_back_on_open == 1
        after = await wal.append(data(b"after"))
        log = await log_of(wal)
        term = wal.term
    rollbacks = [m for m in log if m.type is MessageType.ROLLBACK_TXN]
    assert [m.txn for m in rollbacks] == [left.context]
    assert rollbacks[0].vchannel == "v2"
    assert rollbacks[0].message_id < after.message_id
    # The new writer's first message (the 10 ms sync may write more TimeTicks later).
    opening = next(m for m in log if m.term == term)
    assert opening.type is MessageType.TIME_TICK
    begin = next(m for m in log if m.type is MessageType.BEGIN_TXN and m.txn == left.context)
    # While the new writer recovered, its messages kept the orphan's begin in view.
    assert opening.last_confirmed_id is not None
    assert opening.last_confirmed_id <= begin.message_id < body.message_id
    assert rollbacks[0].last_confirmed_id is not None
    assert rollbacks[0].last_confirmed_id <= begin.message_id


async def test_nothing_is_rolled_back_when_every_transaction_ended(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        async with wal.txn("v1") as txn:
            await txn.append(data(b"x"))
        rolled = await wal.begin_txn("v1")
        await rolled.rollback()
    async with await walsvc.open_wal(url, "p0") as wal:
        await wal.wait_ready()
        assert member(wal, Transactions).rolled_back_on_open == 0


async def _faulty_commit(fault: str, *, unreadable: bool = False) -> tuple[Any, list[Any]]:
    """Commit a one-body transaction whose CommitTxn append meets ``fault``; return what
    the commit returned or raised, and the log."""
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    chain = interceptors.default_chain(sync_interval=None)
    pchannel = f"c{uuid.uuid4().hex[:8]}"
    async with await walsvc.open_wal(name, pchannel, interceptors=chain) as wal:
        txn = await wal.begin_txn("v1")
        await txn.append(data(b"body"))
        _faulty.FaultyBackend.faults[pchannel] = [fault]
        if unreadable:
            _faulty.FaultyBackend.unreadable.add(pchannel)
        try:
            outcome: Any = await txn.commit()
        except walsvc.WALError as exc:
            outcome = exc
        finally:
            _faulty.FaultyBackend.unreadable.discard(pchannel)
        log = await log_of(wal)
    return outcome, log


async def test_an_ambiguous_commit_that_landed_is_a_commit() -> None:
    outcome, log = await _faulty_commit("lost-ack")
    (commit,) = [m for m in log if m.type is MessageType.COMMIT_TXN]
    assert outcome == AppendResult(commit.message_id, commit.timetick, commit.last_confirmed_id)
    assert not any(m.type is MessageType.ROLLBACK_TXN for m in log)


async def test_an_ambiguous_commit_that_did_not_land_is_rolled_back() -> None:
    outcome, log = await _faulty_commit("lost-write")
    assert isinstance(outcome, walsvc.TxnAborted)
    assert "not written" in str(outcome)
    assert [m.type for m in log if m.txn is not None][-1] is MessageType.ROLLBACK_TXN
    assert not any(m.type is MessageType.COMMIT_TXN for m in log)


async def test_an_ambiguous_commit_stays_unknown_while_the_log_cannot_be_read() -> None:
    outcome, _ = await _faulty_commit("lost-ack", unreadable=True)
    assert isinstance(outcome, walsvc.AppendOutcomeUnknown)
    assert "could not be read" in str(outcome)
