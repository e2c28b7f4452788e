"""``open_node("walsvc://...")``: vchannels routed over pchannels a node serves. The
routing is stored through the node, the node is the one timetick authority for all
its pchannels, and what only the log's own process can do (migrate) is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from _node_process import node_serving

import walsvc
from walsvc import InvalidArgument, Message, Node, Routing, RoutingMismatch, open_node

P3 = ("p0", "p1", "p2")


@pytest.fixture(params=["memory", "file"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh node per test (the routing is per log)."""
    with node_serving(request.param, tmp_path_factory.mktemp("node")) as url:
        yield url


async def _replay(node: Node, vchannel: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    async with asyncio.timeout(20), node.read(vchannel) as scanner:
        async for message in scanner:
            if message.type not in walsvc.SYSTEM_TYPES:
                got.append(message.payload)
                if len(got) == count:
                    break
    return got


async def test_vchannels_round_trip_over_the_node_s_pchannels(node: str) -> None:
    vchannels = [f"v{i}" for i in range(9)]
    async with await open_node(node, P3) as routed:
        assert routed.routing == Routing(1, P3)
        assert {routed.pchannel_of(v) for v in vchannels} == set(P3)
        ticks = []
        for round_ in range(2):
            for v in vchannels:
                result = await routed.append(
                    Message(payload=b"%s-%d" % (v.encode(), round_), vchannel=v)
                )
                ticks.append(result.timetick)
        # one clock on the node for all its pchannels: ticks grow across them
        assert ticks == sorted(ticks)
        assert len(set(ticks)) == len(ticks)
        for v in vchannels:
            assert await _replay(routed, v, 2) == [b"%s-0" % v.encode(), b"%s-1" % v.encode()]


async def test_the_routing_is_stored_through_the_node_and_reused(node: str) -> None:
    async with await open_node(node, P3) as routed:
        await routed.append(Message(payload=b"kept", vchannel="v"))
    async with await open_node(node, list(P3)) as routed:
        assert routed.history == (Routing(1, P3),)
        assert await _replay(routed, "v", 1) == [b"kept"]
    async with await open_node(node, P3, read_only=True) as routed:
        assert routed.routing == Routing(1, P3)
    with pytest.raises(RoutingMismatch, match="version 1 over pchannels"):
        await open_node(node, ["p0", "p1"])


async def test_concurrent_first_opens_through_the_node_store_one_version(node: str) -> None:
    # Nothing fences over walsvc:// (the node is the single writer): the routing's
    # idempotency key lands one record and each opener rereads whose it was.
    opened = await asyncio.gather(
        open_node(node, P3), open_node(node, ["p0", "p1"]), return_exceptions=True
    )
    winners = [n for n in opened if isinstance(n, Node)]
    assert len(winners) == 1, opened
    loser = next(n for n in opened if not isinstance(n, Node))
    assert isinstance(loser, walsvc.WALFenced), loser
    stored = winners[0].routing
    await winners[0].aclose()
    async with await open_node(node, stored.pchannels) as routed:
        assert routed.history == (stored,)


async def test_what_only_the_log_s_process_can_do_is_refused(node: str) -> None:
    with pytest.raises(InvalidArgument, match="migrate=True"):
        await open_node(node, P3, migrate=True)
    with pytest.raises(InvalidArgument, match="the node's writers own"):
        await open_node(node, P3, interceptors=[])
    with pytest.raises(InvalidArgument, match="the node's writers own"):
        await open_node(node, P3, timetick_allocator=walsvc.HybridClock())
