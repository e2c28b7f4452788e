"""Exclusive (DDL) messages: per-vchannel serialization, the broadcast vchannel, and
the rollback of open transactions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import _faulty
import pytest
from _chain_support import data, log_of

import walsvc
from interceptors import ExclusiveLock
from walsvc import AppendResult, Message, MessageType
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._chain import AppendNext

_faulty.register()


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


class HoldPayload:
    """Holds appends whose payload is in ``held`` until ``release`` is set; records the
    order in which appends land."""

    def __init__(self, *held: bytes) -> None:
        self.held = set(held)
        self.release = asyncio.Event()
        self.landed: list[bytes] = []

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        if message.payload in self.held:
            await self.release.wait()
        result = await call_next(message)
        self.landed.append(message.payload)
        return result


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_broadcast_ddl_waits_for_every_vchannel_and_holds_every_vchannel() -> None:
    hold = HoldPayload(b"slow-v1", b"slow-v2")
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=[ExclusiveLock(), hold]
    ) as wal:
        slow = [
            asyncio.ensure_future(wal.append(data(p, vchannel=p[-2:].decode())))
            for p in (b"slow-v1", b"slow-v2")
        ]
        await settle()
        ddl = asyncio.ensure_future(
            wal.append(data(b"ddl", vchannel="", type=MessageType.DROP_COLLECTION))
        )
        await settle()
        later = [
            asyncio.ensure_future(wal.append(data(p, vchannel=v)))
            for p, v in ((b"later-v3", "v3"), (b"later-all", ""))
        ]
        later_ddl = asyncio.ensure_future(
            wal.append(data(b"later-ddl", vchannel="v4", type=MessageType.CREATE_PARTITION))
        )
        await settle()
        assert not ddl.done()
        assert not any(f.done() for f in later)
        assert not later_ddl.done()
        assert hold.landed == []  # even v3, untouched by the earlier appends, is held
        hold.release.set()
        await asyncio.gather(*slow, ddl, *later, later_ddl)
    assert sorted(hold.landed[:2]) == [b"slow-v1", b"slow-v2"]
    assert hold.landed[2] == b"ddl"
    assert sorted(hold.landed[3:]) == [b"later-all", b"later-ddl", b"later-v3"]


async def test_a_ddl_holds_broadcast_appends_and_waits_for_them() -> None:
    hold = HoldPayload(b"slow-all")
    async with await walsvc.open_wal(
        f"memory://{uuid.uuid4().hex}", "p", interceptors=[ExclusiveLock(), hold]
    ) as wal:
        slow = asyncio.ensure_future(wal.append(data(b"slow-all", vchannel="")))
        await settle()
        ddl = asyncio.ensure_future(wal.append(data(b"ddl", type=MessageType.DROP_PARTITION)))
        await settle()
        after = asyncio.ensure_future(wal.append(data(b"after-all", vchannel="")))
        elsewhere = asyncio.ensure_future(wal.append(data(b"elsewhere", vchannel="v2")))
        await settle()
        assert not ddl.done()
        assert not after.done()
        assert hold.landed == [b"elsewhere"]  # another vchannel is not held
        hold.release.set()
        await asyncio.gather(slow, ddl, after, elsewhere)
    assert hold.landed == [b"elsewhere", b"slow-all", b"ddl", b"after-all"]


async def test_a_broadcast_ddl_rolls_back_every_open_transaction(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        txns = [await wal.begin_txn(v) for v in ("v1", "v2", "")]
        for txn in txns:
            await txn.append(data(b"x", vchannel=txn.vchannel))
        await wal.append(data(b"", vchannel="", type=MessageType.DROP_COLLECTION))
        for txn in txns:
            with pytest.raises(walsvc.TxnAborted, match="broadcast vchannel"):
                await txn.commit()
        log = await log_of(wal)
    rolled_back = {m.txn for m in log if m.type is MessageType.ROLLBACK_TXN}
    assert rolled_back == {txn.context for txn in txns}


async def test_admitted_plain_appends_count_in_flight_and_see_the_gates() -> None:
    """``admit_plain`` (the WAL's way for a plain message appended on its own): an
    admitted append holds back a DDL of its vchannel until ``release_plain``; while that
    DDL is pending, plain messages of its vchannel are refused (they wait in
    ``do_append``) and those of other vchannels admitted; an exclusive type is never
    admitted."""
    lock = ExclusiveLock()
    appended: list[bytes] = []

    async def call_next(message: Message) -> AppendResult:
        appended.append(message.payload)
        return AppendResult(MemoryMessageId(len(appended)), len(appended), None)

    plain = data(b"plain")
    assert lock.admit_plain(plain)
    ddl = asyncio.ensure_future(
        lock.do_append(data(b"ddl", type=MessageType.DROP_PARTITION), call_next)
    )
    await asyncio.sleep(0)
    assert not ddl.done(), "the DDL waits for the admitted append"
    assert not lock.admit_plain(data(b"later")), "held back behind the pending DDL"
    elsewhere = data(b"elsewhere", vchannel="v2")
    assert lock.admit_plain(elsewhere)
    lock.release_plain(elsewhere)
    assert not lock.admit_plain(data(b"", type=MessageType.DROP_PARTITION, vchannel="v3"))
    lock.release_plain(plain)
    await ddl
    assert appended == [b"ddl"]
    assert lock.admit_plain(data(b"after"))
    lock.release_plain(data(b"after"))


class SlowBatches:
    """The next step of the chain for ``ExclusiveLock`` under test: batches wait for
    ``release``, single appends land at once; ``landed`` is the order they land in."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.landed: list[bytes] = []

    async def batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        await self.release.wait()
        self.landed += [m.payload for m in messages]
        return [AppendResult(MemoryMessageId(i), i, None) for i in range(len(messages))]

    async def one(self, message: Message) -> AppendResult:
        self.landed.append(message.payload)
        return AppendResult(MemoryMessageId(0), 0, None)


async def test_a_batch_in_flight_holds_back_ddls_of_its_vchannels_only() -> None:
    lock, chain = ExclusiveLock(), SlowBatches()
    batch = asyncio.ensure_future(
        lock.do_append_batch([data(b"a", vchannel="v1"), data(b"b", vchannel="v2")], chain.batch)
    )
    await settle()
    await lock.do_append(data(b"ddl-v3", vchannel="v3", type=MessageType.DROP_PARTITION), chain.one)
    ddl_v2 = asyncio.ensure_future(
        lock.do_append(data(b"ddl-v2", vchannel="v2", type=MessageType.DROP_PARTITION), chain.one)
    )
    await settle()
    held_batch = asyncio.ensure_future(
        lock.do_append_batch([data(b"c", vchannel="v3"), data(b"d", vchannel="v2")], chain.batch)
    )
    ddl_all = asyncio.ensure_future(
        lock.do_append(data(b"ddl-all", vchannel="", type=MessageType.DROP_COLLECTION), chain.one)
    )
    await settle()
    assert chain.landed == [b"ddl-v3"]  # another vchannel's DDL did not wait
    assert not ddl_v2.done()
    assert not ddl_all.done()
    assert not held_batch.done()
    chain.release.set()
    await asyncio.gather(batch, ddl_v2, held_batch, ddl_all)
    assert chain.landed[:4] == [b"ddl-v3", b"a", b"b", b"ddl-v2"]
    # The held batch and the broadcast DDL were both waiting: either may go first.
    assert sorted(chain.landed[4:]) == [b"c", b"d", b"ddl-all"]


@pytest.mark.parametrize(
    ("batch_vchannels", "ddl_vchannel", "waits"),
    [
        (("v1", "v2"), "v2", True),
        (("v1", "v2"), "v3", False),
        (("v1",), "", True),  # a broadcast DDL waits for every append in flight
        (("v1", ""), "v9", True),  # a broadcast message reaches every vchannel
    ],
)
async def test_whether_a_ddl_waits_for_a_batch_in_flight(
    batch_vchannels: tuple[str, ...], ddl_vchannel: str, waits: bool
) -> None:
    lock, chain = ExclusiveLock(), SlowBatches()
    batch = asyncio.ensure_future(
        lock.do_append_batch([data(v.encode(), vchannel=v) for v in batch_vchannels], chain.batch)
    )
    await settle()
    ddl = asyncio.ensure_future(
        lock.do_append(
            data(b"ddl", vchannel=ddl_vchannel, type=MessageType.DROP_PARTITION), chain.one
        )
    )
    await settle()
    assert ddl.done() is not waits
    chain.release.set()
    await asyncio.gather(batch, ddl)
    assert (chain.landed[-1] == b"ddl") is waits
