"""A transaction's calls over a connection that drops (protocol version 2): the begin,
the bodies and the commit whose answers were lost are resent on the next connection and
the node answers them from what it did, so the log holds each once. Against a version 1
node they raise ``AppendOutcomeUnknown``, as they always did. The node is a subprocess;
a TCP proxy holds the answers and cuts the connection."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _node_process import node_process
from _tcp_proxy import TcpProxy

import walsvc
from walsvc import DeliverPolicy, Message, MessageType


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with node_process(f"file://{tmp_path_factory.mktemp('node')}") as (node_url, _):
        yield node_url


@pytest.fixture
async def proxy(node: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    proxy = TcpProxy.for_url(node)
    url = await proxy.start()
    try:
        yield proxy, url
    finally:
        await proxy.aclose()


async def _raw_log(node: str, pchannel: str) -> list[walsvc.ImmutableMessage]:
    """Every message of ``pchannel`` as stored (transaction parts one by one), straight
    from the node."""
    async with await walsvc.open_wal(node, pchannel, read_only=True) as wal:
        latest = await wal.latest_message_id()
        found: list[walsvc.ImmutableMessage] = []
        if latest is None:
            return found
        async with asyncio.timeout(30), wal.read(DeliverPolicy.all(), raw=True) as scanner:
            async for message in scanner:
                if message.type != MessageType.TIME_TICK:
                    found.append(message)
                if message.message_id == latest:
                    break
        return found


async def _lose_the_answer(
    tcp: TcpProxy, node: str, pchannel: str, call: Any, stored: int
) -> asyncio.Future[Any]:
    """Start ``call`` with its answer held in the proxy; once the node stored ``stored``
    messages in all, cut the connection; return the call."""
    tcp.hold("down")
    started = asyncio.ensure_future(call)
    async with asyncio.timeout(10):
        while len(await _raw_log(node, pchannel)) < stored:  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.02)
    assert not started.done()
    assert tcp.cut() == 1
    return started


async def test_a_transaction_whose_answers_were_lost_lands_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with await walsvc.open_wal(url, pchannel) as wal:
        txn = await (await _lose_the_answer(tcp, node, pchannel, wal.begin_txn("v"), 1))
        bodies = [Message(payload=b"b%d" % i, vchannel="v") for i in range(4)]
        one = await _lose_the_answer(tcp, node, pchannel, txn.append(bodies[0]), 2)
        assert (await one).message_id is not None
        many = await _lose_the_answer(tcp, node, pchannel, txn.append_many(bodies[1:]), 5)
        assert len(await many) == 3
        commit = await (await _lose_the_answer(tcp, node, pchannel, txn.commit(), 6))
        assert wal.connection.reconnects == 4
    stored = await _raw_log(node, pchannel)
    assert [m.type for m in stored] == [
        MessageType.BEGIN_TXN,
        *[MessageType.INSERT] * 4,
        MessageType.COMMIT_TXN,
    ]
    assert [m.payload for m in stored[1:5]] == [b.payload for b in bodies]
    assert stored[-1].message_id == commit.message_id
    assert {m.txn.txn_id for m in stored if m.txn is not None} == {txn.txn_id}


async def test_a_rollback_whose_answer_was_lost_is_answered_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with await walsvc.open_wal(url, pchannel) as wal:
        txn = await wal.begin_txn("v")
        await txn.append(Message(payload=b"gone", vchannel="v"))
        await (await _lose_the_answer(tcp, node, pchannel, txn.rollback(), 3))
    stored = await _raw_log(node, pchannel)
    assert [m.type for m in stored] == [
        MessageType.BEGIN_TXN,
        MessageType.INSERT,
        MessageType.ROLLBACK_TXN,
    ]


async def test_against_a_version_1_node_a_lost_answer_is_unknown(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with await walsvc.open_wal(url, pchannel, versions=(1, 1)) as wal:
        assert wal.connection.version == 1
        txn = await wal.begin_txn("v")
        lost = await _lose_the_answer(
            tcp, node, pchannel, txn.append(Message(payload=b"x", vchannel="v")), 2
        )
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await lost


async def test_without_exactly_once_a_lost_answer_is_unknown(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    async with await walsvc.open_wal(url, pchannel, exactly_once=False) as wal:
        lost = await _lose_the_answer(tcp, node, pchannel, wal.begin_txn("v"), 1)
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await lost
