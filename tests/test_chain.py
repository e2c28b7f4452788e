"""The interceptor chain: order, rewriting, short-circuits, ready hooks, misuse."""

from __future__ import annotations

import asyncio
import uuid

import _faulty
import pytest
from _chain_support import data, log_of

import interceptors
import walsvc
from interceptors import Dedup, Redo
from walsvc import AppendResult, Message, MessageType
from walsvc.core._chain import AppendNext
from walsvc.testing import memory_wal

_faulty.register()


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


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (walsvc.CorruptRecord("cannot rebuild"), walsvc.CorruptRecord),
        (RuntimeError("a bug in a hook"), walsvc.WALError),
    ],
)
async def test_a_failed_ready_fails_every_later_call_with_a_wal_error(
    url: str, raised: Exception, expected: type[walsvc.WALError]
) -> None:
    """Every append, batch, transaction and ``wait_ready`` raises the error that failed
    the start, as a WALError, however often it is asked (before: a bare AssertionError
    from the third call on)."""

    class Broken:
        async def ready(self, context: walsvc.InterceptorContext) -> None:
            raise raised

    async with await walsvc.open_wal(
        url, "p", interceptors=[Broken(), *interceptors.default_chain()]
    ) as wal:
        for _ in range(3):
            with pytest.raises(expected, match=str(raised)) as caught:
                await wal.append(data(b"x"))
            assert type(caught.value) is type(raised) or not isinstance(raised, walsvc.WALError)
            with pytest.raises(expected, match=str(raised)):
                await wal.append_many([data(b"x"), data(b"y", idempotency_key="k")])
            with pytest.raises(expected, match=str(raised)):
                await wal.begin_txn("v1")
            with pytest.raises(expected, match=str(raised)):
                await wal.wait_ready()


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
    """A second WAL given an interceptor that serves another is refused at open, before
    its backend is opened (which would fence the pchannel's writer), with a WALError."""
    dedup = Dedup()
    name = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "a", interceptors=[dedup]) as wal:
        await wal.append(data(b"x"))
        with pytest.raises(walsvc.InvalidArgument, match="already serves WAL 'a'"):
            await walsvc.open_wal(name, "b", interceptors=[dedup])
    # Closed, the first WAL still holds its state: the instance stays taken.
    with pytest.raises(walsvc.InvalidArgument, match="Build a chain per WAL"):
        await walsvc.open_wal(name, "b", interceptors=[dedup])
    other = Dedup()
    with pytest.raises(walsvc.InvalidArgument, match="this chain twice"):
        await walsvc.open_wal(name, "c", interceptors=[other, other])


async def test_a_chain_factory_builds_one_chain_per_wal() -> None:
    name = f"memory://{uuid.uuid4().hex}"

    def chain() -> list[walsvc.ChainMember]:
        return [Dedup()]

    async with (
        await walsvc.open_wal(name, "a", interceptors=chain) as a,
        await walsvc.open_wal(name, "b", interceptors=chain) as b,
    ):
        assert a.interceptors[0] is not b.interceptors[0]
        await a.append(data(b"x"))
        await b.append(data(b"y"))


async def test_a_plain_batch_gets_consecutive_ticks_and_one_last_confirmed_id(url: str) -> None:
    """``append_many`` of bare messages takes its ticks in one allocator call: they are
    consecutive, above every earlier tick and below every later one, and the batch
    shares one last-confirmed id; a batch with properties goes message by message."""
    async with await walsvc.open_wal(url, "p0") as wal:
        before = await wal.append(data(b"before"))
        batch = await wal.append_many([data(b"%d" % i) for i in range(20)])
        mixed = await wal.append_many(
            [data(b"a"), Message(payload=b"b", vchannel="v1", properties={"k": "v"})]
        )
        after = await wal.append(data(b"after"))
        log = await log_of(wal)
    ticks = [r.timetick for r in batch]
    assert ticks == list(range(ticks[0], ticks[0] + 20))
    assert before.timetick < ticks[0]
    assert ticks[-1] < mixed[0].timetick < mixed[1].timetick
    assert mixed[1].timetick < after.timetick
    assert len({r.last_confirmed_id for r in batch}) == 1
    stored = {m.message_id: m for m in log}
    assert [stored[r.message_id].timetick for r in batch] == ticks
    assert dict(stored[mixed[1].message_id].properties) == {"k": "v"}


class Admitting(Recorder):
    """A ``PlainAdmission`` member: admits plain messages unless their payload is
    b"refuse NAME"; records admissions and releases besides ``do_append``."""

    def admit_plain(self, message: Message) -> bool:
        if message.payload == f"refuse {self.name}".encode():
            self.calls.append(f"{self.name} refused")
            return False
        self.calls.append(f"{self.name} admit")
        return True

    def release_plain(self, message: Message) -> None:
        self.calls.append(f"{self.name} release")


async def test_plain_appends_skip_do_append_when_every_member_admits_them() -> None:
    """Both members admit: no ``do_append``, releases after the append, also after a
    failed one. The second refuses: the first releases what it took and the message
    goes down the chain through both ``do_append``s."""
    calls: list[str] = []
    url = f"memory://{uuid.uuid4().hex}"
    wal = await walsvc.open_wal(
        url, "p", interceptors=[Admitting("a", calls), Admitting("b", calls)]
    )
    await wal.append(data(b"x"))
    assert calls == ["a admit", "b admit", "a release", "b release"]
    calls.clear()
    await wal.append(data(b"refuse b"))
    assert calls == ["a admit", "b refused", "a release", "a>", "b>", "<b", "<a"]
    calls.clear()
    await wal.append(Message(payload=b"k", vchannel="v", idempotency_key="k1"))
    assert calls == ["a>", "b>", "<b", "<a"], "a keyed message is not plain"
    calls.clear()
    async with await walsvc.open_wal(url, "p", interceptors=[]):  # fences wal
        with pytest.raises(walsvc.WALFenced):
            await wal.append(data(b"y"))
    assert calls == ["a admit", "b admit", "a release", "b release"]
    await wal.aclose()


async def test_one_member_without_admission_keeps_every_plain_append_in_do_append() -> None:
    calls: list[str] = []
    chain = [Admitting("a", calls), Recorder("b", calls)]
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=chain
    ) as wal:
        await wal.append(data(b"x"))
    assert calls == ["a>", "b>", "<b", "<a"]


async def test_an_append_acknowledged_at_once_fails_as_an_awaited_one_would() -> None:
    """The synchronous path (``Backend.append_now``): a failure before the write is the
    backend's typed error and writes nothing; one after it is ``AppendOutcomeUnknown``."""
    url = f"{_faulty.NOW_SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p", interceptors=[]) as wal:
        _faulty.FaultyBackend.faults["p"] = ["unavailable", "lost-write", "lost-ack"]
        with pytest.raises(walsvc.BackendUnavailable, match="unreachable"):
            await wal.append(data(b"unavailable"))
        with pytest.raises(walsvc.AppendOutcomeUnknown, match="may or may not be in the log"):
            await wal.append(data(b"lost-write"))
        with pytest.raises(walsvc.AppendOutcomeUnknown, match="may or may not be in the log"):
            await wal.append(data(b"lost-ack"))
        landed = await wal.append(data(b"ok"))
        log = await log_of(wal)
    assert [m.payload for m in log] == [b"lost-ack", b"ok"]
    assert log[-1].message_id == landed.message_id
