"""``walsvc.open_node``'s stored routing: it is stored with the log and reused, another
pchannel list is a ``RoutingMismatch``, and ``migrate=True`` stores a new version with a
cut per pchannel; replays read across the cuts (a timetick floor skips older versions, a
cut on a TimeTick or inside a transaction left open ends its stretch, batches cross it)
and keep every message readable; concurrent first opens store one version. Real backends
only (``url`` is memory and file)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from _node_support import P3, data_of, first, msg, read_to_end, replay

import scanners
import walsvc
from walsvc import (
    DeliverPolicy,
    InvalidArgument,
    MessageType,
    Node,
    Routing,
    RoutingMismatch,
    open_node,
)

# ---------------------------------------------------------------------------------------
# The stored routing: reopen, mismatch, migration


async def test_the_routing_is_stored_in_the_backend_and_reused(url: str) -> None:
    async with await open_node(url, P3) as node:
        await node.append(msg(b"kept", "v"))
    async with await open_node(url, list(P3)) as node:
        assert node.routing == Routing(1, P3)
        assert node.history == (node.routing,)
        assert await replay(node, "v") == [b"kept"]
    async with await walsvc.open_wal(url, "walsvc.routing", read_only=True) as meta:
        async with meta.read() as scanner:
            stored = await anext(scanner)
    assert msgspec.json.decode(stored.payload, type=Routing) == Routing(1, P3)


async def test_another_pchannel_list_is_a_mismatch(url: str) -> None:
    await (await open_node(url, P3)).aclose()
    with pytest.raises(RoutingMismatch, match=r"version 1 over pchannels \['p0', 'p1', 'p2'\]"):
        await open_node(url, ["p0", "p1"])
    with pytest.raises(RoutingMismatch, match="the order is part of the mapping"):
        await open_node(url, ["p2", "p1", "p0"])
    with pytest.raises(InvalidArgument, match="migrate=True"):
        await open_node(url, ["p0", "p1", "p2", "p3"])
    async with await open_node(url, P3) as node:
        assert node.routing.version == 1


async def test_migration_keeps_every_message_readable(url: str) -> None:
    vchannels = [f"v{i}" for i in range(20)]
    expected: dict[str, list[bytes]] = {v: [] for v in vchannels}

    async def write(node: Node, tag: bytes) -> None:
        for v in vchannels:
            for i in range(2):
                await node.append(msg(b"%s-%d" % (tag, i), v))
                expected[v].append(b"%s-%d" % (tag, i))
        await node.broadcast(msg(tag + b"-all", ""))
        for v in vchannels:
            expected[v].append(tag + b"-all")

    async with await open_node(url, ["p0", "p1"]) as node:
        await write(node, b"one")
        v1 = node.routing
    async with await open_node(url, P3, migrate=True) as node:
        assert node.routing.version == 2
        assert node.history == (v1, node.routing)
        assert {c.pchannel for c in node.routing.cuts} == set(P3)
        moved = [v for v in vchannels if v1.pchannel_of(v) != node.pchannel_of(v)]
        assert moved
        assert {node.pchannel_of(v) for v in moved} == {"p2"}
        await write(node, b"two")
        for v in vchannels:
            assert await replay(node, v) == expected[v]
    with pytest.raises(RoutingMismatch, match="version 2"):
        await open_node(url, ["p0", "p1"])
    # Shrink to one pchannel: p1 and p2 are read through read-only WALs.
    async with await open_node(url, ["p0"], migrate=True) as node:
        assert node.routing.version == 3
        await write(node, b"three")
        for v in vchannels:
            assert await replay(node, v) == expected[v]
        # Other policies read the current pchannel only.
        v = vchannels[0]
        tail = node.read(v, DeliverPolicy.latest())
        async with tail:
            await node.append(msg(b"later", v))
            (later,) = [m async for m in first(tail, 1)]
        assert later.payload == b"later"
    async with await open_node(url, ["p0"]) as node:
        assert [r.version for r in node.history] == [1, 2, 3]


async def test_a_timetick_floor_skips_older_versions(url: str) -> None:
    async with await open_node(url, ["p0"]) as node:
        await node.append(msg(b"old", "v"))
    async with await open_node(url, ["p1"], migrate=True) as node:
        new = await node.append(msg(b"new", "v"))
        await node.append(msg(b"end-", "v"))
        scanner = node.read("v", filters=[scanners.timetick_gte(new.timetick)])
        assert await read_to_end(scanner, b"end-") == [b"new"]
        assert await read_to_end(node.read("v"), b"end-") == [b"old", b"new"]


async def newest_is_a_timetick(wal: walsvc.WAL) -> None:
    """Wait until the newest record of ``wal`` is a TimeTick (the timetick sync persists
    one after a burst of appends)."""
    async with asyncio.timeout(20):
        while True:
            latest = await wal.latest_message_id()
            assert latest is not None
            async with wal.read(DeliverPolicy.start_from(latest), raw=True) as scanner:
                if (await anext(scanner)).type is MessageType.TIME_TICK:
                    return
            await asyncio.sleep(0.01)


async def test_a_cut_on_a_timetick_ends_its_stretch(url: str) -> None:
    """The newest record of a pchannel at migration is often the TimeTick the sync wrote
    after the last append; a replay must see that stretch end (it waited forever)."""
    async with await open_node(url, ["p0"]) as node:
        await node.append(msg(b"old", "v"))
        await newest_is_a_timetick(node.wal("p0"))
    async with await open_node(url, ["p1"], migrate=True) as node:
        (cut,) = [c for c in node.routing.cuts if c.pchannel == "p0"]
        assert cut.vchannel == ""  # the TimeTick
        await node.append(msg(b"new", "v"))
        assert await replay(node, "v") == [b"old", b"new"]
        async with asyncio.timeout(20), node.read("v") as scanner:
            got = []
            async for batch in scanner.batches():
                got += [m.payload for message in batch for m in data_of(message)]
                if len(got) >= 2:
                    break
        assert got[:2] == [b"old", b"new"]


async def test_a_transaction_left_open_does_not_stall_a_replay(url: str) -> None:
    """The cut of a pchannel may fall inside a transaction its last writer left open;
    the transaction is never delivered, yet the replay gets past the cut."""
    for pchannels in (["p0"], ["p1"], ["p1", "p0"]):  # p0 dropped, then p1 kept
        async with await open_node(url, pchannels, migrate=True) as node:
            await node.append(msg(b"before-%d" % len(pchannels), "v"))
            txn = await node.begin_txn("v")
            await txn.append(msg(b"orphan", "v"))  # closing the node leaves it open
    async with await open_node(url, ["p1", "p0"]) as node:
        assert [r.pchannel_of("v") for r in node.history] == ["p0", "p1", "p0"]
        assert await replay(node, "v") == [b"before-1", b"before-1", b"before-2"]


async def test_batches_cross_a_migration(url: str) -> None:
    async with await open_node(url, ["p0"]) as node:
        await node.append_many([msg(b"old-%d" % i, "v") for i in range(5)])
    async with await open_node(url, ["p1"], migrate=True) as node:
        await node.append_many([msg(b"new-%d" % i, "v") for i in range(5)])
        await node.append(msg(b"end", "v"))
        got: list[bytes] = []
        async with asyncio.timeout(20), node.read("v") as scanner:
            async for batch in scanner.batches():
                assert batch
                got += [m.payload for message in batch for m in data_of(message)]
                if got[-1:] == [b"end"]:
                    break
    assert got == [b"old-%d" % i for i in range(5)] + [b"new-%d" % i for i in range(5)] + [b"end"]


async def test_concurrent_first_opens_store_one_version(url: str) -> None:
    # Bare WALs: a writer fenced before its opening TimeTick would log that hook's error.
    opening = [open_node(url, P3, interceptors=[]) for _ in range(2)]
    opened = await asyncio.gather(*opening, return_exceptions=True)
    for node in opened:
        if isinstance(node, Node):
            assert node.routing == Routing(1, P3)
            await node.aclose()
        else:
            assert isinstance(node, walsvc.WALFenced), node
    assert any(isinstance(node, Node) for node in opened)
    async with await open_node(url, P3) as node:
        assert node.history == (Routing(1, P3),)
