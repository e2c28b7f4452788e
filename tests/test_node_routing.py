"""How ``walsvc.open_node`` maps vchannels to pchannels: the hash mapping
("jump-blake2b-v1": pinned, stable, spread evenly, and growth moves about 1 in n and only
to the new pchannel), ``Routing``'s validation and JSON form, and pins (vchannels placed
by hand, ``balanced_pins``) stored and versioned with the log. The stored routing's
migration is in test_node_migration.py."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable

import msgspec
import pytest
from _node_support import P3, P4, msg, replay

import walsvc
from walsvc import InvalidArgument, Routing, RoutingMismatch, open_node
from walsvc.node._routing import HASHES, Cut, jump_blake2b_v1

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
