"""Exactly-once past the dedup window (protocol version 3, ``Recall``): a producer whose
answers were lost while other producers pushed its keys out of the node's window asks
the node what became of its appends before sending them again; the node finds them in
the log. A node process with a small window (``--dedup-keys``), a TCP proxy, real
sockets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _chain_support import whole_log
from _node_process import node_process
from _tcp_proxy import TcpProxy, proxied

import walsvc
from interceptors import Dedup
from walsvc import Message, MessageType
from walsvc.remote._client import RemoteWAL

WINDOW = 16


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = f"file://{tmp_path_factory.mktemp('node')}"
    with node_process(log, "--dedup-keys", str(WINDOW)) as (node_url, _):
        yield node_url


async def _user_log(node: str, pchannel: str) -> list[walsvc.ImmutableMessage]:
    """The messages appended to ``pchannel`` (no TimeTicks), read straight from the node."""
    return [m for m in await whole_log(node, pchannel) if m.type != MessageType.TIME_TICK]


async def _payloads(node: str, pchannel: str) -> list[bytes]:
    """The payloads of ``_user_log``."""
    return [m.payload for m in await _user_log(node, pchannel)]


async def _lose_answers_while_the_window_turns_over(
    node: str, tcp: TcpProxy, wal: walsvc.WAL, pchannel: str
) -> list[asyncio.Future[Any]]:
    """Appends of ``wal`` (through the proxy) that land while their answers are held,
    then 4 windows of keyed appends by another producer, straight to the node."""
    tcp.hold("down")
    calls: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(wal.append(Message(payload=b"lost-%d" % i, vchannel="v")))
        for i in range(5)
    ]
    calls.append(
        asyncio.ensure_future(
            wal.append_many([Message(payload=b"many-%d" % i, vchannel="v") for i in range(3)])
        )
    )
    async with asyncio.timeout(10):  # until they landed on the node
        while len(await _payloads(node, pchannel)) < 9:  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.02)
    async with await walsvc.open_wal(node, pchannel) as other:
        await other.append_many(
            [Message(payload=b"other-%d" % i, vchannel="v") for i in range(4 * WINDOW)]
        )
    return calls


async def test_appends_whose_keys_left_the_window_land_once_after_a_reconnect(
    node: str,
) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with proxied(node) as (tcp, url):
        async with await walsvc.open_wal(url, pchannel) as wal:
            assert isinstance(wal, RemoteWAL)
            assert wal.connection.version == 3
            await wal.append(Message(payload=b"first", vchannel="v"))
            calls = await _lose_answers_while_the_window_turns_over(node, tcp, wal, pchannel)
            assert not any(call.done() for call in calls)
            assert tcp.cut() == 1
            async with asyncio.timeout(30):
                answers = await asyncio.gather(*calls)
            assert wal.connection.reconnects == 1
    log = await _payloads(node, pchannel)
    mine = [p for p in log if not p.startswith(b"other-")]
    assert sorted(mine) == sorted(
        [b"first", *(b"lost-%d" % i for i in range(5)), *(b"many-%d" % i for i in range(3))]
    ), "an append landed twice (or not at all)"
    ids = {m.payload: m.message_id for m in await _user_log(node, pchannel)}
    *singles, many = answers
    assert [r.message_id for r in singles] == [ids[b"lost-%d" % i] for i in range(5)]
    assert [r.message_id for r in many] == [ids[b"many-%d" % i] for i in range(3)]


async def test_a_client_of_version_2_resends_as_before(node: str) -> None:
    """Over version 2 there is no ``Recall``: appends whose answers were lost are sent
    again and answered from the window, which still holds their keys here."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with proxied(node) as (tcp, url):
        async with await walsvc.open_wal(url, pchannel, versions=(1, 2)) as wal:
            assert isinstance(wal, RemoteWAL)
            assert wal.connection.version == 2
            tcp.hold("down")
            call = asyncio.ensure_future(wal.append(Message(payload=b"once", vchannel="v")))
            async with asyncio.timeout(10):
                while not await _payloads(node, pchannel):  # noqa: ASYNC110 (another process)
                    await asyncio.sleep(0.02)
            assert tcp.cut() == 1
            async with asyncio.timeout(30):
                await call
    assert await _payloads(node, pchannel) == [b"once"]


async def test_a_fresh_client_starts_from_the_tick_the_node_had_given(node: str) -> None:
    """A client that has no answer yet bounds its ``Recall`` by what ``Opened`` said, not
    by tick 0 (which would read the whole log after the window dropped a key)."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with await walsvc.open_wal(node, pchannel) as first:
        last = await first.append(Message(payload=b"x", vchannel="v"))
        async with await walsvc.open_wal(node, pchannel) as second:
            assert isinstance(second, RemoteWAL)
            assert second.connection.seen_tick >= last.timetick
        async with await walsvc.open_wal(node, pchannel, versions=(1, 2)) as old:
            assert isinstance(old, RemoteWAL)
            assert old.connection.seen_tick == 0  # version 2 says nothing


async def test_a_connection_given_up_on_appends_nothing_after_its_producer_reconnects(
    node: str,
) -> None:
    """The link goes silent with an append on its way; the client gives up on it, asks
    the node (the append has not arrived: nil), and sends it again, where it lands.
    Then the old link delivers the first copy late, after the window dropped the key:
    the node refuses it (the producer's reopening fenced the old handle), so it lands
    once."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with proxied(node) as (tcp, url):
        async with await walsvc.open_wal(url, pchannel, heartbeat=0.1) as wal:
            assert isinstance(wal, RemoteWAL)
            await wal.append(Message(payload=b"first", vchannel="v"))
            tcp.hold("up", "down")  # the old pair holds the append, both ways
            late = asyncio.ensure_future(wal.append(Message(payload=b"late", vchannel="v")))
            async with asyncio.timeout(30):
                await late  # resent on a new connection after the heartbeat gave up
            assert wal.connection.reconnects == 1
            async with await walsvc.open_wal(node, pchannel) as other:
                await other.append_many(
                    [Message(payload=b"other-%d" % i, vchannel="v") for i in range(4 * WINDOW)]
                )
            tcp.release()  # the old pair delivers its copy of the append now
            await wal.append(Message(payload=b"after", vchannel="v"))  # a round trip later
            await asyncio.sleep(0.2)
    mine = [p for p in await _payloads(node, pchannel) if not p.startswith(b"other-")]
    assert mine == [b"first", b"late", b"after"]


async def test_appends_the_node_cannot_tell_about_raise_outcome_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection in a node in this process (a log that cannot be read where the
    window dropped keys): the appends whose answers were lost raise
    ``AppendOutcomeUnknown`` and are not sent again; later appends go on."""

    async def unreadable(self: Dedup, keys: object, since_tick: int) -> list[object]:
        raise walsvc.AppendOutcomeUnknown("the log cannot be read there (injected)")

    monkeypatch.setattr(Dedup, "recall", unreadable)
    async with walsvc.serve(f"file://{tmp_path}") as server, proxied(server.node_url) as (tcp, url):
        pchannel = f"p-{uuid.uuid4().hex[:10]}"
        async with await walsvc.open_wal(url, pchannel) as wal:
            tcp.hold("down")
            lost = asyncio.ensure_future(wal.append(Message(payload=b"lost", vchannel="v")))
            async with asyncio.timeout(10):
                while not await _payloads(server.node_url, pchannel):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            tcp.cut()
            with pytest.raises(walsvc.AppendOutcomeUnknown, match="cannot tell whether it landed"):
                await lost
            await wal.append(Message(payload=b"next", vchannel="v"))
        assert await _payloads(server.node_url, pchannel) == [b"lost", b"next"]


async def test_the_node_forgets_a_producer_when_its_connection_closes(tmp_path: Path) -> None:
    """One fence entry per producer that has a connection: none left once they close
    (read-only openers name no producer)."""
    async with walsvc.serve(f"file://{tmp_path}") as server:
        pchannel = f"p-{uuid.uuid4().hex[:10]}"
        wals = [await walsvc.open_wal(server.node_url, pchannel) for _ in range(3)]
        reader = await walsvc.open_wal(server.node_url, pchannel, read_only=True)
        assert len(server.producers) == 3
        for wal in [*wals, reader]:
            await wal.aclose()
        async with asyncio.timeout(10):
            while len(server.producers):  # noqa: ASYNC110 (the node closes them in turn)
                await asyncio.sleep(0.01)
