"""Transactions over walsvc://: a node in a subprocess (memory:// and file://), clients
over real sockets. Commit, rollback, batches and keyed replays round trip; every error
arrives as the type a local WAL raises (the same script runs on both and must end the
same); a transaction is the node's, so closing the client's connection neither aborts
it (a new connection takes it up with ``resume_txn``) nor keeps it alive past its
keepalive.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import walsvc
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.remote._client import RemoteWAL


def _pchannel() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def _next_data(scanner: walsvc.Scanner) -> walsvc.ImmutableMessage:
    async with asyncio.timeout(30):
        return await anext(scanner)


async def test_commit_rollback_batches_and_replays_round_trip(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        reader = wal.read(DeliverPolicy.latest())
        async with wal.txn("v") as txn:
            assert isinstance(txn, walsvc.Txn)
            one = await txn.append(Message(payload=b"a", vchannel="v"))
            many = await txn.append_many(
                [Message(payload=b"b%d" % i, vchannel="v", type=MessageType.DELETE) for i in (1, 2)]
            )
        assert txn.state is walsvc.TxnState.COMMITTED
        assert txn.commit_result is not None
        assert txn.begin_result.message_id < one.message_id < many[0].message_id
        dropped = await wal.begin_txn("v")
        await dropped.append(Message(payload=b"never", vchannel="v"))
        await dropped.rollback()
        assert dropped.state is walsvc.TxnState.ROLLED_BACK
        plain = await wal.append(Message(payload=b"plain", vchannel="v"))
        got = await _next_data(reader)
        assert got.type is MessageType.TXN
        assert got.message_id == txn.commit_result.message_id
        assert [m.payload for m in got.body] == [b"a", b"b1", b"b2"]
        assert [m.message_id for m in got.body] == [one.message_id, *(r.message_id for r in many)]
        assert all(m.txn == txn.context for m in got.body)
        assert (await _next_data(reader)).message_id == plain.message_id  # the rollback: unseen
        await reader.aclose()

        for attempt in range(2):  # a keyed transaction commits once, then replays
            async with wal.txn("k", idempotency_key="key") as keyed:
                body = await keyed.append(Message(payload=b"k", vchannel="k"))
            assert keyed.replayed is (attempt == 1)
            if attempt == 0:
                first, first_body = keyed.commit_result, body
        assert (keyed.commit_result, body) == (first, first_body)
        with pytest.raises(walsvc.TxnNotActive, match="earlier run"):
            async with wal.txn("k", idempotency_key="key") as keyed:
                await keyed.rollback()


async def _error_script(wal: walsvc.WAL, other: walsvc.WAL) -> list[str]:
    """Provoke every transaction error on ``wal`` (``other``: a read-only handle of the
    same pchannel); return the error types met, in order."""
    met: list[str] = []

    async def expect(call: object) -> None:
        try:
            await call  # type: ignore[misc]
        except Exception as exc:
            met.append(type(exc).__name__)
        else:
            met.append("no error")

    txn = await wal.begin_txn("v")
    await expect(txn.append(Message(payload=b"x", vchannel="other")))  # InvalidMessage
    await expect(txn.append(Message(payload=b"x", vchannel="v", idempotency_key="k")))
    await txn.commit()
    await expect(txn.append(Message(payload=b"x", vchannel="v")))  # TxnNotActive
    await expect(txn.commit())
    short = await wal.begin_txn("v", keepalive=0.05)
    await asyncio.sleep(0.4)
    await wal.append(Message(payload=b"tick", vchannel="w"))  # time moves on the node
    await expect(short.append(Message(payload=b"late", vchannel="v")))  # TxnExpired
    await expect(short.commit())  # TxnExpired again: the handle says how it ended
    doomed = await wal.begin_txn("d")
    await wal.append(Message(payload=b"ddl", vchannel="d", type=MessageType.CREATE_COLLECTION))
    await expect(doomed.append(Message(payload=b"x", vchannel="d")))  # TxnAborted
    for bad in (0, -1, True, "1", 86_401):
        await expect(wal.begin_txn("v", keepalive=bad))  # type: ignore[arg-type]
    await expect(wal.begin_txn(7))  # type: ignore[arg-type]
    await expect(wal.begin_txn("v", idempotency_key=5))  # type: ignore[arg-type]
    await expect(other.begin_txn("v"))  # WALReadOnly
    await expect(other.txn("v").__aenter__())
    await other.aclose()
    await expect(other.begin_txn("v"))  # WALClosed
    open_one = await wal.begin_txn("v")
    await wal.aclose()
    await expect(open_one.append(Message(payload=b"x", vchannel="v")))  # WALClosed
    return met


async def test_errors_are_the_types_a_local_wal_raises(node: str) -> None:
    pchannel = _pchannel()
    local = await walsvc.open_wal(f"memory://local-{pchannel}", pchannel)
    local_ro = await walsvc.open_wal(f"memory://local-{pchannel}", pchannel, read_only=True)
    remote = await walsvc.open_wal(node, pchannel)
    remote_ro = await walsvc.open_wal(node, pchannel, read_only=True)
    try:
        expected = await _error_script(local, local_ro)
        assert await _error_script(remote, remote_ro) == expected
    finally:  # (the scripts close them; a failing one may not have)
        for wal in (local, local_ro, remote, remote_ro):
            await wal.aclose()
    assert expected == [
        "InvalidMessage",
        "InvalidMessage",
        "TxnNotActive",
        "TxnNotActive",
        "TxnExpired",
        "TxnExpired",
        "TxnAborted",
        *["InvalidArgument"] * 5,
        "InvalidMessage",
        "InvalidMessage",
        "WALReadOnly",
        "WALReadOnly",
        "WALClosed",
        "WALClosed",
    ]


async def test_a_transaction_outlives_its_connection_and_expires_by_keepalive(
    node: str,
) -> None:
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as first:
        lasting = await first.begin_txn("v", keepalive=60)
        before = await lasting.append(Message(payload=b"before", vchannel="v"))
        fleeting = await first.begin_txn("v", keepalive=0.3)
        await fleeting.append(Message(payload=b"soon gone", vchannel="v"))
    # The connection closed: the node aborted neither transaction.
    wal = await walsvc.open_wal(node, pchannel)
    assert isinstance(wal, RemoteWAL)
    async with wal:
        reader = wal.read()
        resumed = await wal.resume_txn(lasting.txn_id)
        assert (resumed.txn_id, resumed.context, resumed.vchannel) == (
            lasting.txn_id,
            lasting.context,
            "v",
        )
        assert resumed.begin_result == lasting.begin_result
        after = await resumed.append(Message(payload=b"after", vchannel="v"))
        commit = await resumed.commit()
        got = await _next_data(reader)
        assert got.type is MessageType.TXN
        assert got.message_id == commit.message_id
        assert [m.message_id for m in got.body] == [before.message_id, after.message_id]
        # The short one, left alone, expired on the node by its keepalive (and was rolled
        # back: no TXN for it ever reaches the reader).
        await asyncio.sleep(0.6)
        await wal.append(Message(payload=b"tick", vchannel="w"))
        late = await wal.resume_txn(fleeting.txn_id)
        with pytest.raises(walsvc.TxnExpired):
            await late.append(Message(payload=b"late", vchannel="v"))
        with pytest.raises(walsvc.TxnExpired):
            await wal.resume_txn(fleeting.txn_id)
        with pytest.raises(walsvc.TxnNotActive, match="committed"):
            await wal.resume_txn(lasting.txn_id)
        with pytest.raises(walsvc.UnknownTxn):
            await wal.resume_txn(12345)
        assert (await _next_data(reader)).payload == b"tick"
        await reader.aclose()
