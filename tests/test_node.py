"""``walsvc.open_node``: each vchannel's appends, broadcasts, transactions and reads
run on its pchannel; a node's lifecycle (close, read-only, a failed open), its typed
errors for bad input, and subscriptions kept on a vchannel's pchannel. Real backends only
(``url`` is memory and file). The mapping itself is in test_node_routing.py, the stored
routing and its migration in test_node_migration.py."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from _node_support import P3, P4, data_of, first, msg, read_to_end, replay

import scanners
import walsvc
from interceptors import Redo
from walsvc import (
    DeliverPolicy,
    InvalidArgument,
    InvalidMessage,
    Message,
    MessageType,
    Routing,
    WALClosed,
    WALReadOnly,
    open_node,
)

# ---------------------------------------------------------------------------------------
# Appends and reads through the node


async def test_each_vchannel_round_trips_on_its_own_pchannel(url: str) -> None:
    vchannels = [f"v{i}" for i in range(12)]
    async with await open_node(url, P3) as node:
        assert node.routing == Routing(1, P3)
        assert {node.pchannel_of(v) for v in vchannels} == set(P3)
        for round_ in range(3):
            for v in vchannels:
                result = await node.append(msg(b"%s-%d" % (v.encode(), round_), v))
                assert result.message_id is not None
        for v in vchannels:
            wal = node.wal_for(v)
            assert wal is node.wal(node.pchannel_of(v))
            assert wal.pchannel == node.routing.pchannel_of(v)
            assert await replay(node, v) == [b"%s-%d" % (v.encode(), r) for r in range(3)]


async def test_broadcast_reaches_every_pchannel_and_every_vchannel(url: str) -> None:
    async with await open_node(url, P3, interceptors=[]) as node:
        await node.append(msg(b"before", "a"))
        results = await node.broadcast(msg(b"everyone", ""))
        assert set(results) == set(P3)
        for v in ["a", "b", "c", "d"]:
            expected = [b"before", b"everyone"] if v == "a" else [b"everyone"]
            assert await replay(node, v) == expected


async def test_append_many_returns_results_in_input_order(url: str) -> None:
    vchannels = [f"v{i}" for i in range(9)]
    batch = [msg(b"%d" % i, vchannels[i % 9]) for i in range(60)]
    async with await open_node(url, P3) as node:
        assert len({node.pchannel_of(v) for v in vchannels}) > 1
        results = await node.append_many(batch)
        assert await node.append_many([]) == []
        assert len(results) == len(batch)
        for v in vchannels:
            mine = [(m, r) for m, r in zip(batch, results, strict=True) if m.vchannel == v]
            ids = [r.message_id for _, r in mine]
            assert ids == sorted(ids)
            assert await replay(node, v) == [m.payload for m, _ in mine]
            async with node.read(v) as scanner:
                got = [m async for m in first(scanner, len(mine)) if m.vchannel == v]
            assert [m.message_id for m in got] == ids


async def test_transactions_run_on_the_vchannel_s_pchannel(url: str) -> None:
    async with await open_node(url, P3) as node:
        async with node.txn("orders") as txn:
            await txn.append(msg(b"t1", "orders"))
            await txn.append(msg(b"t2", "orders"))
        manual = await node.begin_txn("users", keepalive=5.0)
        await manual.append(msg(b"u1", "users"))
        await manual.commit()
        assert txn.state is walsvc.TxnState.COMMITTED
        assert await replay(node, "orders") == [b"t1", b"t2"]
        assert await replay(node, "users") == [b"u1"]


async def test_a_keyed_transaction_is_exactly_once_through_a_node(url: str) -> None:
    async with await open_node(url, P3) as node:
        async with node.txn("orders", idempotency_key="o-1") as first:
            await first.append_many([msg(b"t1", "orders"), msg(b"t2", "orders")])
    async with await open_node(url, P3) as node:  # a producer restarted, retrying
        async with node.txn("orders", idempotency_key="o-1") as again:
            await again.append_many([msg(b"t1", "orders"), msg(b"t2", "orders")])
        assert again.replayed
        assert again.commit_result == first.commit_result
        assert await replay(node, "orders") == [b"t1", b"t2"]


async def test_batches_and_filters(url: str) -> None:
    async with await open_node(url, P3) as node:
        await node.append(Message(payload=b"x", vchannel="v", type=MessageType.DELETE))
        await node.append(msg(b"y", "v"))
        await node.append(msg(b"end", "v"))
        got: list[bytes] = []
        scanner = node.read("v", filters=[scanners.types(MessageType.INSERT)])
        async with asyncio.timeout(20), scanner:
            async for batch in scanner.batches():
                got += [m.payload for message in batch for m in data_of(message)]
                if got[-1:] == [b"end"]:
                    break
        assert got == [b"y", b"end"]


# ---------------------------------------------------------------------------------------
# Lifecycle and bad input


async def test_a_closed_node_raises_wal_closed() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    node = await open_node(url, P3)
    scanner = node.read("v")
    await node.append(msg(b"x", "v"))
    await node.aclose()
    await node.aclose()  # idempotent
    assert node.closed
    with pytest.raises(WALClosed):
        await anext(scanner)
    await scanner.aclose()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: node.append(msg(b"x", "v")),
        lambda: node.append_many([msg(b"x", "v")]),
        lambda: node.broadcast(msg(b"x", "")),
        lambda: node.begin_txn("v"),
    ]
    for call in calls:
        with pytest.raises(WALClosed):
            await call()
    sync_calls: list[Callable[[], object]] = [
        lambda: node.read("v"),
        lambda: node.wal_for("v"),
        lambda: node.wal("p0"),
    ]
    for sync_call in sync_calls:
        with pytest.raises(WALClosed):
            sync_call()
    assert "closed" in repr(node)


async def test_bad_input_gets_typed_errors() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    for pchannels, complaint in [
        ("p0", "sequence of names"),
        ([], "at least one pchannel"),
        (["p0", "p0"], "repeat"),
        (["walsvc.routing"], "reserved"),
        (["-bad"], "must be 1-200 characters"),
        ([7], "must be 1-200 characters"),
    ]:
        with pytest.raises(InvalidArgument, match=complaint):
            await open_node(url, pchannels)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="one WAL"):
        await open_node(url, P3, interceptors=[Redo()])
    with pytest.raises(InvalidArgument, match="cannot migrate"):
        await open_node(url, P3, read_only=True, migrate=True)
    with pytest.raises(InvalidArgument, match="no routing is stored"):
        await open_node(url, P3, read_only=True)
    async with await open_node(url, P3, interceptors=lambda: []) as node:
        with pytest.raises(InvalidMessage, match=r"Node\.broadcast"):
            await node.append(msg(b"x", ""))
        with pytest.raises(InvalidMessage, match=r"Node\.broadcast"):
            await node.append_many([msg(b"x", "v"), msg(b"x", "")])
        with pytest.raises(InvalidMessage, match="broadcast takes vchannel ''"):
            await node.broadcast(msg(b"x", "v"))
        with pytest.raises(TypeError):
            await node.append(b"x")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="vchannel must be str"):
            node.read(7)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="broadcast"):
            node.wal_for("")
        with pytest.raises(InvalidArgument, match="not one of"):
            node.wal("p9")
        with pytest.raises(TypeError, match="DeliverPolicy"):
            node.read("v", "all")  # type: ignore[arg-type]
        assert await node.wal_for("v").latest_message_id() is None  # no interceptors: no ticks


async def test_a_read_only_node_reads_and_refuses_writes(url: str) -> None:
    async with await open_node(url, P3) as node:
        await node.append(msg(b"x", "v"))
        await node.append(msg(b"end-", "v"))
    async with await open_node(url, P3, read_only=True) as reader:
        assert reader.routing.version == 1
        with pytest.raises(WALReadOnly):
            await reader.append(msg(b"y", "v"))
        assert await read_to_end(reader.read("v"), b"end-") == [b"x"]


async def test_a_failed_open_closes_what_it_opened(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    await (await open_node(url, P3)).aclose()
    shutil.rmtree(tmp_path / "p1")
    with pytest.raises(InvalidArgument, match="no file WAL for pchannel 'p1'"):
        await open_node(url, P3, read_only=True)
    async with await open_node(url, P3) as node:  # p1 is created again
        await node.append(msg(b"x", "v"))


async def test_node_read_keeps_a_subscription_on_the_vchannels_pchannel(url: str) -> None:
    async with await open_node(url, P4) as node:
        first = await node.append(msg(b"1", "orders"))
        async with node.read("orders", subscription="billing") as scanner:
            got = await anext(scanner)
            assert got.message_id == first.message_id
            await scanner.ack(got)
        second = await node.append(msg(b"2", "orders"))
        async with node.read("orders", subscription="billing") as scanner:
            assert (await anext(scanner)).message_id == second.message_id  # resumed
        with pytest.raises(walsvc.SubscriptionBusy):
            async with node.read("orders", subscription="billing"):
                node.read("orders", subscription="billing")


async def test_node_read_refuses_a_subscription_that_would_skip_a_moved_history(
    url: str,
) -> None:
    async with await open_node(url, ["p0"]) as node:
        await node.append(msg(b"old", "v7"))
    async with await open_node(url, ["p0", "p1"], pins={"v7": "p1"}, migrate=True) as node:
        with pytest.raises(walsvc.InvalidArgument, match="history spans"):
            node.read("v7", subscription="s")
        async with node.read("v7", DeliverPolicy.latest(), subscription="s") as scanner:
            # A subscription starts at its first read (it loads its checkpoint then).
            waiting = asyncio.ensure_future(anext(scanner))
            live = scanner._scanner
            assert live is not None
            async with asyncio.timeout(30):
                while live.stats().source == "not started":  # noqa: ASYNC110 (no event to wait on)
                    await asyncio.sleep(0.01)
            sent = await node.append(msg(b"new", "v7"))
            async with asyncio.timeout(30):
                assert (await waiting).message_id == sent.message_id
