"""The interceptor chain and the default interceptors: timetick sync, transactions, dedup,
exclusive DDL and redo. Time is an injected clock; no test sleeps to wait for a timer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _faulty
import pytest

import interceptors
import scanners
import walsvc
from interceptors import Dedup, ExclusiveLock, Redo, TimetickSync, Transactions
from walsvc import (
    AppendResult,
    DeliverPolicy,
    HybridClock,
    ImmutableMessage,
    Message,
    MessageType,
)
from walsvc._chain import AppendNext
from walsvc.testing import memory_wal

_faulty.register()


class FakeClock:
    """Wall-clock milliseconds that move only when a test says so."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    return f"file://{tmp_path / 'log'}"


async def open_manual(url: str, clock: FakeClock, **kwargs: Any) -> walsvc.WAL:
    """A WAL on the fake clock whose timetick sync runs only when the test says so."""
    kwargs.setdefault("interceptors", interceptors.default_chain(sync_interval=None))
    wal = await walsvc.open_wal(url, "p0", timetick_allocator=HybridClock(now_ms=clock), **kwargs)
    await wal.wait_ready()
    return wal


def member(wal: walsvc.WAL, kind: type[Any]) -> Any:
    (found,) = [m for m in wal.interceptors if isinstance(m, kind)]
    return found


async def log_of(wal: walsvc.WAL) -> list[ImmutableMessage]:
    """Everything in the log, up to the newest message."""
    latest = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    async with wal.read() as scanner:
        async for message in scanner:
            if message.persisted:
                out.append(message)
            if message.message_id == latest:
                return out
    return out


def data(payload: bytes, vchannel: str = "v1", **kwargs: Any) -> Message:
    return Message(payload=payload, vchannel=vchannel, **kwargs)


# ---------------------------------------------------------------------------------------
# The chain


class Recorder:
    """Records the order in which chain members see an append."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name
        self.calls = calls

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        self.calls.append(f"{self.name}>")
        result = await call_next(message)
        self.calls.append(f"<{self.name}")
        return result


async def test_the_first_interceptor_is_outermost() -> None:
    calls: list[str] = []
    chain = [Recorder("a", calls), Recorder("b", calls)]
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=chain
    ) as wal:
        await wal.append(data(b"x"))
    assert calls == ["a>", "b>", "<b", "<a"]


async def test_an_interceptor_may_rewrite_and_short_circuit() -> None:
    class Upper:
        async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
            return await call_next(
                Message(payload=message.payload.upper(), vchannel=message.vchannel)
            )

    class Cache:
        def __init__(self) -> None:
            self.last: AppendResult | None = None

        async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
            if message.payload == b"again" and self.last is not None:
                return self.last
            self.last = await call_next(message)
            return self.last

    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=[Cache(), Upper()]
    ) as wal:
        first = await wal.append(data(b"hello"))
        assert await wal.append(data(b"again")) == first
        log = await log_of(wal)
    assert [m.payload for m in log if m.type is MessageType.INSERT] == [b"HELLO"]


async def test_appends_wait_for_ready_and_reads_do_not() -> None:
    release = asyncio.Event()

    class Slow:
        async def ready(self, context: walsvc.InterceptorContext) -> None:
            await release.wait()

    name = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "p", interceptors=[]) as wal:
        before = await wal.append(data(b"before"))
    async with await walsvc.open_wal(name, "p", interceptors=[Slow()]) as wal:
        append = asyncio.ensure_future(wal.append(data(b"x")))
        async with wal.read() as scanner:
            assert (await anext(scanner)).message_id == before.message_id  # not held back
            await asyncio.sleep(0)
            assert not append.done()
            release.set()
            result = await append
            assert (await anext(scanner)).message_id == result.message_id


async def test_a_failed_ready_fails_every_append() -> None:
    class Broken:
        async def ready(self, context: walsvc.InterceptorContext) -> None:
            raise walsvc.CorruptRecord("cannot rebuild")

    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=[Broken()]
    ) as wal:
        for _ in range(2):
            with pytest.raises(walsvc.CorruptRecord, match="cannot rebuild"):
                await wal.append(data(b"x"))


async def test_user_messages_cannot_be_system_or_transaction_messages() -> None:
    async with await memory_wal() as wal:
        for type_ in walsvc.SYSTEM_TYPES:
            with pytest.raises(walsvc.InvalidMessage, match="written by the WAL"):
                await wal.append(data(b"", type=type_))
        forged = data(b"", txn=walsvc.TxnContext(1, 1000))
        with pytest.raises(walsvc.InvalidMessage, match="begin_txn"):
            await wal.append(forged)
        with pytest.raises(walsvc.InvalidMessage):
            await wal.append_many([data(b"ok"), forged])


async def test_read_only_takes_no_interceptors_and_txns_need_the_interceptor() -> None:
    name = f"memory://{uuid.uuid4().hex}"
    with pytest.raises(walsvc.InvalidArgument, match="read-only"):
        await walsvc.open_wal(name, "p", read_only=True, interceptors=[Redo()])
    async with await walsvc.open_wal(name, "p", interceptors=[]) as wal:
        with pytest.raises(walsvc.InvalidArgument, match="transaction interceptor"):
            await wal.begin_txn("v1")


async def test_an_interceptor_serves_one_wal() -> None:
    dedup = Dedup()
    name = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "a", interceptors=[dedup]) as wal:
        await wal.append(data(b"x"))
    async with await walsvc.open_wal(name, "b", interceptors=[dedup]) as wal:
        with pytest.raises(RuntimeError, match="serves one WAL"):
            await wal.append(data(b"x"))


# ---------------------------------------------------------------------------------------
# Timetick


async def test_open_writes_a_timetick_and_ticks_increase_across_restarts(
    url: str, clock: FakeClock
) -> None:
    ticks: list[int] = []
    for round_ in range(3):
        async with await open_manual(url, clock) as wal:
            await wal.append(data(b"r%d" % round_))
            await wal.append_many([data(b"a"), data(b"b")])
        clock.ms -= 60_000  # the wall clock steps back between restarts
    async with await walsvc.open_wal(url, "p0", read_only=True) as wal:
        log = await log_of(wal)
    ticks = [m.timetick for m in log]
    assert ticks == sorted(ticks)
    assert len(set(ticks)) == len(ticks)
    kinds = [m.type for m in log]
    assert kinds.count(MessageType.TIME_TICK) == 3  # one per open
    assert kinds[0] is MessageType.TIME_TICK


async def test_sync_persists_only_after_appends_and_idle_ticks_reach_tailing_readers(
    url: str, clock: FakeClock
) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        assert await sync.sync_once() is None  # nothing appended, nobody listening
        sent = await wal.append(data(b"x"))
        clock.ms += 10
        persisted = await sync.sync_once()
        assert persisted is not None
        assert persisted > sent.timetick
        async with wal.read(DeliverPolicy.start_after(sent.message_id)) as scanner:
            tick = await anext(scanner)
            assert (tick.type, tick.timetick, tick.persisted) == (
                MessageType.TIME_TICK,
                persisted,
                True,
            )
            latest = await wal.latest_message_id()
            waiting = asyncio.ensure_future(anext(scanner))
            await asyncio.sleep(0)  # the scanner is now waiting at the end of the log
            clock.ms += 10
            idle = await sync.sync_once()
            got = await waiting
        assert idle is not None
        assert idle > persisted
        assert (got.timetick, got.persisted, got.message_id) == (idle, False, latest)
        assert got.last_confirmed_id is not None
        assert await wal.latest_message_id() == latest  # idle ticks are not written


async def test_every_message_carries_a_last_confirmed_id_at_or_before_itself(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        results = [await wal.append(data(b"%d" % i)) for i in range(5)]
        results += await wal.append_many([data(b"m")] * 3)
        log = await log_of(wal)
    for result in results:
        assert result.last_confirmed_id is not None
        assert result.last_confirmed_id < result.message_id
    for message in log[1:]:
        assert message.last_confirmed_id is not None
        assert message.last_confirmed_id < message.message_id


async def test_the_timer_persists_a_tick_after_appends() -> None:
    """The real timer (10 ms): a tailing reader gets a persisted TimeTick after data."""
    async with await walsvc.open_wal(f"memory://{uuid.uuid4().hex}", "p") as wal:
        sent = await wal.append(data(b"x"))
        async with wal.read(DeliverPolicy.start_after(sent.message_id)) as scanner:
            async with asyncio.timeout(10):
                tick = await anext(scanner)
        assert tick.type is MessageType.TIME_TICK
        assert tick.persisted
        assert tick.timetick > sent.timetick


def test_sync_interval_is_validated() -> None:
    for bad in (0, -1, float("nan"), True, "10ms"):
        with pytest.raises(ValueError, match="interval"):
            TimetickSync(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Transactions


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


# ---------------------------------------------------------------------------------------
# Exclusive (DDL) messages


async def test_ddl_fails_the_open_transactions_of_its_vchannel_only(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        doomed = await wal.begin_txn("v1")
        await doomed.append(data(b"x"))
        other = await wal.begin_txn("v2")
        ddl = await wal.append(data(b"", type=MessageType.DROP_COLLECTION))
        with pytest.raises(walsvc.TxnAborted, match="DROP_COLLECTION"):
            await doomed.append(data(b"y"))
        await other.append(data(b"z", vchannel="v2"))
        await other.commit()
        log = await log_of(wal)
    rollback = next(m for m in log if m.type is MessageType.ROLLBACK_TXN)
    assert rollback.txn == doomed.context
    assert rollback.message_id < ddl.message_id  # rolled back before the DDL landed


async def test_ddl_waits_for_earlier_appends_of_its_vchannel_and_holds_later_ones() -> None:
    gate = asyncio.Event()
    landed: list[bytes] = []

    class HoldFirst:
        async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
            if message.payload == b"slow":
                await gate.wait()
            result = await call_next(message)
            landed.append(message.payload)
            return result

    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=[ExclusiveLock(), HoldFirst()]
    ) as wal:
        slow = asyncio.ensure_future(wal.append(data(b"slow")))
        await asyncio.sleep(0)
        ddl = asyncio.ensure_future(wal.append(data(b"ddl", type=MessageType.CREATE_PARTITION)))
        await asyncio.sleep(0)
        after = asyncio.ensure_future(wal.append(data(b"after")))
        elsewhere = await wal.append(data(b"elsewhere", vchannel="v2"))  # not held
        assert elsewhere is not None
        assert not ddl.done()
        gate.set()
        await asyncio.gather(slow, ddl, after)
    assert landed == [b"elsewhere", b"slow", b"ddl", b"after"]


# ---------------------------------------------------------------------------------------
# Dedup


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


# ---------------------------------------------------------------------------------------
# Redo


async def test_redo_retries_retriable_errors_and_never_fenced(clock: FakeClock) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    redo = Redo(sleep=sleep, give_up_after=5.0)
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "r", interceptors=[redo]) as wal:
        _faulty.FaultyBackend.faults["r"] = ["unavailable"] * 3
        await wal.append(data(b"x"))
        assert redo.retries == 3
        assert len(slept) == 3
        assert slept == sorted(slept) or max(slept) <= 0.5
        async with await walsvc.open_wal(name, "r", interceptors=[]):
            with pytest.raises(walsvc.WALFenced):
                await wal.append(data(b"y"))
        assert redo.retries == 3


async def test_redo_gives_up_after_its_budget() -> None:
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    redo = Redo(sleep=sleep, clock=lambda: now[0], give_up_after=1.0)
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "s", interceptors=[redo]) as wal:
        _faulty.FaultyBackend.faults["s"] = ["unavailable"] * 1000
        with pytest.raises(walsvc.BackendUnavailable):
            await wal.append(data(b"x"))
        _faulty.FaultyBackend.faults["s"] = []
    assert 1 < redo.retries < 1000


async def test_filters_still_see_system_messages() -> None:
    async with await memory_wal() as wal:
        async with wal.txn("v1") as txn:
            await txn.append(data(b"x"))
        selected: Sequence[walsvc.Filter] = [
            scanners.vchannel("v1"),
            scanners.types(MessageType.DELETE),
        ]
        async with wal.read(filters=selected) as scanner:
            got = [await anext(scanner) for _ in range(3)]
    assert [m.type for m in got] == [
        MessageType.TIME_TICK,
        MessageType.BEGIN_TXN,
        MessageType.COMMIT_TXN,
    ]
