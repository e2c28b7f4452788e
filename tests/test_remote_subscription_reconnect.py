"""Durable subscriptions across lost connections: clients of a node (a subprocess)
through a TCP proxy that cuts and holds connections. A subscription stream resumes from
the node's checkpoint without gap or repeat; an ack lost with its connection is sent
again to the resumed stream, ahead of a close or a flush that follows it, so what the
reader acknowledged and then closed or flushed is durable on the node."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _chain_support import take
from _node_process import node_process
from _tcp_proxy import TcpProxy

import walsvc
from walsvc import DeliverPolicy, Message


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with node_process(f"file://{tmp_path_factory.mktemp('node')}") as (node_url, _):
        yield node_url


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def test_a_subscription_reader_resumes_without_gap_or_duplicate(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    """Cut under a subscription stream that acknowledges as it goes: the node's scanner
    of the old connection writes its checkpoint and releases the name, the resumed
    stream starts from that checkpoint, and the client drops what it had received."""
    tcp, url = proxy
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel) as writer,
        await walsvc.open_wal(url, pchannel, read_only=True, window_messages=32) as reader,
    ):
        expected = [b"%d" % i for i in range(300)]
        await writer.append_many([Message(payload=p, vchannel="v") for p in expected])
        got: list[bytes] = []
        async with asyncio.timeout(60):
            scanner = reader.read(DeliverPolicy.all(), subscription="resumer")
            async for message in scanner:
                got.append(message.payload)
                if len(got) % 7 == 0:
                    await scanner.ack(message)
                if len(got) % 60 == 0:
                    tcp.cut()
                if len(got) == len(expected):
                    break
            await scanner.aclose()
        assert got == expected
        assert reader.connection.reconnects >= 4


async def test_an_ack_lost_with_its_connection_is_sent_again_on_resume(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    """An ack that never reached the node (held in the proxy, then the connection cut)
    is sent again behind the resumed stream's ``Read``: the subscription's checkpoint
    moves past the acknowledged message, so its next reader starts after it."""
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as writer:
        first = [Message(payload=b"a%d" % i, vchannel="v") for i in range(5)]
        await writer.append_many(first)
        async with (
            asyncio.timeout(30),
            await walsvc.open_wal(url, pchannel, read_only=True) as reader,
        ):
            scanner = reader.read(DeliverPolicy.all(), subscription="lost-ack")
            got = await take(scanner, 5)
            tcp.hold("up")
            await scanner.ack(got[-1])
            for _ in range(3):  # the frame with the ack leaves the client
                await asyncio.sleep(0)
            assert tcp.cut() == 1  # the ack is lost in the proxy
            await writer.append_many([Message(payload=b"b%d" % i, vchannel="v") for i in range(3)])
            more = await take(scanner, 3)  # delivered over the resumed stream
            assert [m.payload for m in more] == [b"b0", b"b1", b"b2"]
            assert reader.connection.reconnects >= 1
            await scanner.aclose()  # the node writes the checkpoint it knows
        next_one = await _next_reader_starts_at(writer, "lost-ack")
        assert next_one.payload == b"b0"


async def test_an_ack_lost_with_the_close_that_followed_it_is_written_on_the_next_socket(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    """An ack and the ``aclose`` after it, both lost with their connection (held in
    the proxy, then the connection cut): ``aclose`` resumes the stream on the next
    socket, sends the ack again there and closes it, so the subscription's next reader
    starts after the acknowledged message (seen first by the seeded fault schedule's
    subscription readers: ``aclose`` returned as if the checkpoint were written)."""
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as writer:
        await writer.append_many([Message(payload=b"a%d" % i, vchannel="v") for i in range(8)])
        async with (
            asyncio.timeout(30),
            await walsvc.open_wal(url, pchannel, read_only=True) as reader,
        ):
            scanner = reader.read(DeliverPolicy.all(), subscription="lost-close")
            got = await take(scanner, 5)
            tcp.hold("up")
            await scanner.ack(got[-1])
            closing = asyncio.ensure_future(scanner.aclose())
            for _ in range(3):  # the frames with the ack and the close leave the client
                await asyncio.sleep(0)
            assert tcp.cut() == 1  # both are lost in the proxy
            await closing
        next_one = await _next_reader_starts_at(writer, "lost-close")
        assert next_one.payload == b"a5"


async def test_a_subscription_resumed_before_its_first_ack_keeps_what_was_not_acknowledged(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    """A subscription reader that received messages and acknowledged none, resumed on a
    new socket and then closed: the next reader starts at the first message. (Resumed
    after the last message received, the node's scanner of a subscription with no
    checkpoint started there, and the idle ticks it met moved the checkpoint past every
    message the reader had received and not acknowledged.)"""
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as writer:
        await writer.append_many([Message(payload=b"a%d" % i, vchannel="v") for i in range(4)])
        async with (
            asyncio.timeout(30),
            await walsvc.open_wal(url, pchannel, read_only=True) as reader,
        ):
            scanner = reader.read(DeliverPolicy.all(), subscription="unacked")
            await take(scanner, 4)
            assert tcp.cut() == 1
            while reader.connection.reconnects < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the writer's idle ticks (every 10 ms) reach the stream
            await scanner.aclose()
        first = await _next_reader_starts_at(writer, "unacked")
        assert first.payload == b"a0"


async def _next_reader_starts_at(wal: walsvc.WAL, subscription: str) -> walsvc.ImmutableMessage:
    """The first message a new reader of ``subscription`` gets (then it closes)."""
    async with (
        asyncio.timeout(30),
        wal.read(DeliverPolicy.all(), subscription=subscription) as again,
    ):
        (first,) = await take(again, 1)
    return first


@pytest.mark.parametrize("when", ["at once", "while reconnecting"])
async def test_a_flush_after_an_ack_lost_with_its_connection_makes_that_ack_durable(
    tmp_path: Path, when: str
) -> None:
    """``flush`` returns once the node wrote the latest ack, also when that ack was lost
    with its connection (held in the proxy, then the connection cut): the flush waits
    for the resumed stream and the ack sent again there. Checked by killing the node
    (-9) right after: the subscription's next reader starts after the acknowledged
    message. Before, a flush sent at once failed ``BackendUnavailable`` with the
    socket, and one made while reconnecting went out on the new socket ahead of the
    resumed stream, found no stream there and returned: the ack was never written."""
    log_url = f"file://{tmp_path}"
    pchannel = _pchannel()
    with node_process(log_url) as (node, process):
        async with await walsvc.open_wal(node, pchannel) as writer:
            await writer.append_many([Message(payload=b"a%d" % i, vchannel="v") for i in range(8)])
        tcp = TcpProxy.for_url(node)
        url = await tcp.start()
        reader = await walsvc.open_wal(url, pchannel, read_only=True, reconnect_timeout=1)
        try:
            async with asyncio.timeout(30):
                scanner = reader.read(
                    DeliverPolicy.all(), subscription="flushed", checkpoint_interval=3600
                )
                got = await take(scanner, 5)
                await scanner.ack(got[0])
                await scanner.flush()
                tcp.hold("up")
                await scanner.ack(got[-1])
                for _ in range(3):  # the frame with the ack leaves the client
                    await asyncio.sleep(0)
                if when == "while reconnecting":
                    tcp.refusing = True
                assert tcp.cut() == 1  # the ack is lost in the proxy
                if when == "while reconnecting":
                    while reader.connection._socket is not None:  # noqa: ASYNC110
                        await asyncio.sleep(0.005)
                    flushing = asyncio.ensure_future(scanner.flush())
                    await asyncio.sleep(0.1)
                    tcp.refusing = False
                    await flushing
                else:
                    await scanner.flush()
                process.kill()  # no clean close: only what was written survives
                process.wait()
        finally:
            await reader.aclose()
            await tcp.aclose()
    with node_process(log_url) as (node, _):
        async with await walsvc.open_wal(node, pchannel) as wal:
            next_one = await _next_reader_starts_at(wal, "flushed")
    assert next_one.payload == b"a5"
