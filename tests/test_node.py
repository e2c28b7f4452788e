"""``walsvc.open_node``: vchannels routed over many pchannels by a stable, versioned hash
mapping stored with the log; migration keeps every message readable. Real backends only
(``url`` is memory and file)."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

import scanners
import walsvc
from interceptors import Redo
from walsvc import (
    DeliverPolicy,
    ImmutableMessage,
    InvalidArgument,
    InvalidMessage,
    Message,
    MessageType,
    Node,
    Routing,
    RoutingMismatch,
    WALClosed,
    WALReadOnly,
    open_node,
)
from walsvc.node._node import NodeScanner
from walsvc.node._routing import HASHES, Cut, jump_blake2b_v1

P3 = ("p0", "p1", "p2")


def msg(payload: bytes, vchannel: str) -> Message:
    return Message(payload=payload, vchannel=vchannel)


def data_of(message: ImmutableMessage) -> list[ImmutableMessage]:
    """The application messages in a delivered message: a committed transaction's body,
    or the message itself; none for system messages."""
    items = message.body if message.type is MessageType.TXN else (message,)
    return [m for m in items if m.type not in walsvc.SYSTEM_TYPES]


async def read_to_end(scanner: NodeScanner, end: bytes) -> list[bytes]:
    """Payloads of the application messages up to ``end`` (excluded), end markers of
    earlier reads (``b"end-..."``) left out."""
    out: list[bytes] = []
    async with asyncio.timeout(20), scanner:
        async for message in scanner:
            for m in data_of(message):
                if m.payload == end:
                    return out
                if not m.payload.startswith(b"end-"):
                    out.append(m.payload)
    raise AssertionError("the scanner ended before the end marker")


async def replay(node: Node, vchannel: str) -> list[bytes]:
    """Every payload of ``vchannel`` (broadcasts included) from the start, in order."""
    end = b"end-" + uuid.uuid4().hex.encode()
    await node.append(msg(end, vchannel))
    return await read_to_end(node.read(vchannel), end)


async def first(scanner: NodeScanner, n: int) -> AsyncIterator[ImmutableMessage]:
    """The first ``n`` application messages of ``scanner``."""
    seen = 0
    async with asyncio.timeout(20):
        async for message in scanner:
            if message.type not in walsvc.SYSTEM_TYPES:
                yield message
                seen += 1
                if seen == n:
                    return


# ---------------------------------------------------------------------------------------
# The mapping: pinned, stable, spread, and growth moves little


@pytest.mark.parametrize(
    ("vchannel", "buckets", "index"),
    [
        ("orders", 1, 0),
        ("orders", 16, 12),
        ("orders", 1000, 742),
        ("users", 2, 1),
        ("users", 1000, 731),
        ("v0", 4, 3),
        ("v0", 16, 10),
        ("v0", 1000, 915),
        ("by-dev-rootcoord-dml_0_123v0", 1000, 57),
        ("", 3, 2),
        ("", 8, 5),
        ("é", 8, 2),
        ("é", 1000, 349),
    ],
)
def test_the_mapping_is_pinned(vchannel: str, buckets: int, index: int) -> None:
    """If this fails, the mapping changed: every stored routing would send vchannels
    elsewhere. Never change "jump-blake2b-v1"; add a new hash name instead."""
    assert jump_blake2b_v1(vchannel, buckets) == index
    routing = Routing(1, tuple(f"p{i}" for i in range(buckets)))
    assert routing.hash == "jump-blake2b-v1"
    assert routing.index_of(vchannel) == index
    assert routing.pchannel_of(vchannel) == f"p{index}"


def test_the_key_is_the_big_endian_8_byte_blake2b_digest() -> None:
    digest = hashlib.blake2b(b"orders", digest_size=8).digest()
    assert int.from_bytes(digest, "big") == 0xD5ACEBE867B47F4D


def test_1000_vchannels_spread_over_8_pchannels() -> None:
    routing = Routing(1, tuple(f"p{i}" for i in range(8)))
    counts = Counter(routing.pchannel_of(f"vchannel-{i}") for i in range(1000))
    assert set(counts) == set(routing.pchannels)
    assert all(80 <= n <= 170 for n in counts.values()), counts  # 125 expected


def test_adding_a_pchannel_moves_about_1_in_n_and_only_to_it() -> None:
    names = [f"collection-{i}" for i in range(2000)]
    before = Routing(1, tuple(f"p{i}" for i in range(8)))
    after = Routing(1, (*before.pchannels, "p8"))
    moved = [v for v in names if before.pchannel_of(v) != after.pchannel_of(v)]
    assert {after.pchannel_of(v) for v in moved} == {"p8"}
    assert 0.07 < len(moved) / len(names) < 0.16  # 1/9 expected


def test_a_routing_is_validated_and_round_trips_as_json() -> None:
    bad_routings: list[Callable[[], object]] = [
        lambda: Routing(0, ("p0",)),
        lambda: Routing(1, ()),
        lambda: Routing(1, ("p0", "p0")),
        lambda: Routing(1, ("p0",), hash="md5-mod"),
        lambda: Routing(2, ("p0", "p1"), cuts=(Cut("p0", None),)),
    ]
    for bad in bad_routings:
        with pytest.raises(InvalidArgument):
            bad()
    with pytest.raises(InvalidArgument, match="vchannel must be str"):
        Routing(1, P3).pchannel_of(7)  # type: ignore[arg-type]
    routing = Routing(2, P3, cuts=tuple(Cut(p, f"memory:{i}") for i, p in enumerate(P3)))
    assert msgspec.json.decode(msgspec.json.encode(routing), type=Routing) == routing


# ---------------------------------------------------------------------------------------
# Pins: vchannels placed by hand


P4 = ("p0", "p1", "p2", "p3")
TEN = [f"v{i}" for i in range(10)]


def test_ten_vchannels_over_four_pchannels_leave_one_empty_under_the_hash() -> None:
    """The reported spread: no hash balances a handful of names (see walsvc.node._routing)."""
    counts = Counter(Routing(1, P4).pchannel_of(v) for v in TEN)
    assert sorted(counts.get(p, 0) for p in P4) == [1, 2, 2, 5]


def test_a_pin_overrides_the_hash_and_only_for_its_vchannel() -> None:
    plain = Routing(1, P4)
    pinned = Routing(1, P4, pins={"v0": "p1", "orders": "p2"})  # type: ignore[arg-type]
    assert plain.pchannel_of("v0") == "p3"
    assert pinned.pchannel_of("v0") == "p1"
    assert pinned.pchannel_of("orders") == "p2"
    assert pinned.pins == (("orders", "p2"), ("v0", "p1"))  # sorted pairs
    assert all(pinned.pchannel_of(v) == plain.pchannel_of(v) for v in TEN[1:])
    assert pinned.hash == "pinned+jump-blake2b-v1"
    assert Routing(1, P4, hash="pinned+jump-blake2b-v1") == plain  # no pins: the plain name
    assert msgspec.json.decode(msgspec.json.encode(pinned), type=Routing) == pinned
    for bad, complaint in [
        ({"v": "p9"}, "not one of"),
        ({"": "p0"}, "non-empty str"),
        ((("v", "p0"), ("v", "p1")), "twice"),
        ((("v",),), "pair"),
        ("v", "pairs"),
    ]:
        with pytest.raises(InvalidArgument, match=complaint):
            Routing(1, P4, pins=bad)  # type: ignore[arg-type]


def test_a_pinned_routing_is_refused_by_a_walsvc_without_pins() -> None:
    """Stored routings written before pins read as before; a pinned one names a mapping
    that walsvc before pins does not know, so it refuses it rather than ignore the pins."""
    before_pins = b'{"version":1,"pchannels":["p0","p1","p2"],"hash":"jump-blake2b-v1","cuts":[]}'
    old = msgspec.json.decode(before_pins, type=Routing)
    assert old == Routing(1, P3)
    assert old.pins == ()
    stored = msgspec.json.decode(msgspec.json.encode(Routing(1, P3, pins={"v": "p0"})))  # type: ignore[arg-type]
    assert stored["hash"] not in {"jump-blake2b-v1"}
    assert set(HASHES) == {"jump-blake2b-v1"}


def test_balanced_pins_spread_ten_vchannels_evenly_with_fewest_moves() -> None:
    pins = walsvc.balanced_pins(P4, TEN)
    routing = Routing(1, P4, pins=pins)  # type: ignore[arg-type]
    counts = Counter(routing.pchannel_of(v) for v in TEN)
    assert sorted(counts.values()) == [2, 2, 3, 3]
    assert len(pins) == 2  # the fullest pchannel (5) gives up two: the fewest moves
    assert walsvc.balanced_pins(P4, reversed(TEN)) == pins  # order does not matter
    # Pins given stay, and count toward their pchannel's share.
    fixed = walsvc.balanced_pins(P4, TEN, pins={"v0": "p0", "v1": "p0", "v2": "p0"})
    assert {v: fixed[v] for v in ("v0", "v1", "v2")} == {"v0": "p0", "v1": "p0", "v2": "p0"}
    counts = Counter(Routing(1, P4, pins=fixed).pchannel_of(v) for v in TEN)  # type: ignore[arg-type]
    assert sorted(counts.values()) == [2, 2, 3, 3]
    many = [f"collection-{i}" for i in range(1001)]
    counts = Counter(
        Routing(1, P4, pins=walsvc.balanced_pins(P4, many)).pchannel_of(v)  # type: ignore[arg-type]
        for v in many
    )
    assert sorted(counts.values()) == [250, 250, 250, 251]
    with pytest.raises(InvalidArgument, match="sequence of names"):
        walsvc.balanced_pins(P4, "v0")


async def test_pins_are_stored_versioned_and_replayed_across(url: str) -> None:
    async with await open_node(url, P4, pins={"v0": "p0"}) as node:
        assert node.pchannel_of("v0") == "p0"
        await node.append(msg(b"one", "v0"))
        await node.append(msg(b"one", "v1"))
    async with await open_node(url, P4) as node:  # pins=None: the stored ones
        assert node.routing == Routing(1, P4, pins={"v0": "p0"})  # type: ignore[arg-type]
        assert node.pchannel_of("v0") == "p0"
    with pytest.raises(RoutingMismatch, match=r"with pins \{'v0': 'p0'\}, not \{'v0': 'p2'\}"):
        await open_node(url, P4, pins={"v0": "p2"})
    with pytest.raises(RoutingMismatch, match="with pins"):
        await open_node(url, P4, pins={}, read_only=True)
    async with await open_node(url, P4, pins={"v0": "p2", "v1": "p0"}, migrate=True) as node:
        assert node.routing.version == 2
        assert {c.pchannel for c in node.routing.cuts} == set(P4)
        assert (node.pchannel_of("v0"), node.pchannel_of("v1")) == ("p2", "p0")
        await node.append(msg(b"two", "v0"))
        await node.append(msg(b"two", "v1"))
        assert await replay(node, "v0") == [b"one", b"two"]
        assert await replay(node, "v1") == [b"one", b"two"]
    # A new pchannel list keeps the stored pins; a pin to a dropped pchannel is refused.
    with pytest.raises(InvalidArgument, match="new list drops"):
        await open_node(url, ["p0", "p1"], migrate=True)
    async with await open_node(url, [*P4, "p4"], migrate=True) as node:
        assert node.routing.version == 3
        assert node.routing.pins == (("v0", "p2"), ("v1", "p0"))
        assert await replay(node, "v0") == [b"one", b"two"]
    async with await open_node(url, [*P4, "p4"], pins={}, migrate=True) as node:
        assert node.routing.pins == ()
        assert node.routing.hash == "jump-blake2b-v1"
        assert await replay(node, "v1") == [b"one", b"two"]
    with pytest.raises(InvalidArgument, match="mapping of vchannel"):
        await open_node(url, P4, pins=[("v0", "p0")])  # type: ignore[arg-type]


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
