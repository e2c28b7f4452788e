"""A node against peers that break the rules, each while a well-behaved client appends
and reads concurrently: what the node queues for a peer that does not read is bounded
(it stops reading that peer's requests, its streams wait) and such a peer is cut off; a
peer that trickles its handshake or a frame, sends nothing (with an idle timeout) or
grants absurd credit is cut off too; a client killed mid-batch loses none of what the
node acknowledged. Each bad peer is logged once; the good client loses nothing.
tests/test_remote_wal.py covers garbage, an absurd length prefix and a frame over the
limit.

The node runs in a subprocess (``walsvc serve``) with short limits; bad peers are raw
sockets speaking the protocol by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import msgspec
import pytest
from _chain_support import take
from _node_process import ROOT, node_process

import walsvc
from walsvc import DeliverPolicy, Message
from walsvc.apps._cli import main
from walsvc.remote import _protocol as p
from walsvc.remote._frames import FrameWriter
from walsvc.remote._node_status import ConnectionStatus, NodeStatus
from walsvc.remote._status import fetch_status
from walsvc.wal._api import DEFAULT_TXN_BUFFER_BYTES

#: The node's limits here: 1 MiB queued per peer, cut off after 1 s over it, 1 s for a
#: frame or the handshake.
QUEUE = 1 << 20
LIMITS = (
    "--send-queue-limit", str(QUEUE), "--stall-timeout", "1", "--frame-timeout", "1",
    "--handshake-timeout", "1",
)  # fmt: skip
#: How long any wait here may take before the test fails (never reached).
PATIENCE = 30


class NodeLog:
    """The node's log, its lines as ``node_process`` reads them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def about(self, port: int) -> list[str]:
        """The lines naming the peer on local port ``port``."""
        return [line for line in self.lines if f"127.0.0.1:{port}:" in line]

    async def wait_for_one_line_about(self, port: int) -> str:
        """The one line about ``port``, once there is one (and a moment for a second,
        which fails the test)."""
        async with asyncio.timeout(PATIENCE):
            while not self.about(port):  # noqa: ASYNC110 (another thread appends)
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        lines = self.about(port)
        assert len(lines) == 1, lines
        return lines[0]


@contextlib.contextmanager
def logged_node(*flags: str) -> Iterator[tuple[str, NodeLog]]:
    url = f"memory://bad-peers-{uuid.uuid4().hex[:8]}"
    log = NodeLog()
    with node_process(url, *flags, log=log.lines) as (node_url, _):
        yield node_url, log
    assert "Traceback" not in "".join(log.lines), "".join(log.lines)


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[str, NodeLog]]:
    """A node with short limits, and its log."""
    with logged_node(*LIMITS) as found:
        yield found


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# -- a raw peer --------------------------------------------------------------------------

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[p.NodeMessage]).decode


def frame(*messages: msgspec.Struct) -> bytes:
    body = p.array_header(len(messages)) + b"".join(_encode(m) for m in messages)
    return p.FRAME_HEADER.pack(len(body)) + body


class RawPeer:
    """A blocking socket that speaks the protocol by hand (on a thread when it blocks)."""

    def __init__(self, url: str, *, receive_buffer: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:  # before connecting: it sets the TCP window
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(PATIENCE)
        self.sock.connect(("127.0.0.1", _port(url)))
        self.port = self.sock.getsockname()[1]

    def _exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionResetError("closed")
            data += chunk
        return data

    def receive(self) -> list[p.NodeMessage]:
        (length,) = p.FRAME_HEADER.unpack(self._exactly(4))
        return _decode(self._exactly(length))

    def hello(self) -> None:
        self.sock.sendall(frame(p.Hello(1, 1, None, "raw")))
        assert isinstance(self.receive()[0], p.Welcome)

    def open(self, pchannel: str) -> int:
        self.sock.sendall(frame(p.OpenWal(1, pchannel, False)))
        (opened,) = self.receive()
        assert isinstance(opened, p.Opened)
        return opened.wal

    def read(self, wal: int, stream: int, credit: tuple[int, int]) -> None:
        read = p.Read(stream, wal, "all", None, 0, None, None, 0, False, False,
                      DEFAULT_TXN_BUFFER_BYTES, *credit)  # fmt: skip
        self.sock.sendall(frame(read))

    def closed_by_node(self) -> bool:
        """Wait until the node closes the connection (reading and dropping the rest)."""
        try:
            while self.sock.recv(1 << 16):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        return True

    def close(self) -> None:
        self.sock.close()


@contextlib.asynccontextmanager
async def raw_peer(url: str, **options: int) -> AsyncIterator[RawPeer]:
    peer = await asyncio.to_thread(RawPeer, url, **options)
    try:
        yield peer
    finally:
        peer.close()


# -- a well-behaved client ---------------------------------------------------------------


class Steady:
    """A client that appends to its own pchannel until stopped; ``acked`` counts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pchannel = f"steady-{uuid.uuid4().hex[:8]}"
        self.acked: list[walsvc.AppendResult] = []

    async def run(self) -> None:
        async with await walsvc.open_wal(self.url, self.pchannel) as wal:
            while True:
                payload = b"steady-%d" % len(self.acked)
                self.acked.append(await wal.append(Message(payload=payload, vchannel="v")))
                await asyncio.sleep(0.002)

    async def check(self) -> None:
        """Everything acknowledged is in the log, once, in order."""
        async with await walsvc.open_wal(self.url, self.pchannel, read_only=True) as reader:
            log = await take(reader.read(), len(self.acked), within=PATIENCE)
        assert [m.message_id for m in log] == [r.message_id for r in self.acked]
        assert [m.payload for m in log] == [b"steady-%d" % i for i in range(len(self.acked))]


@contextlib.asynccontextmanager
async def steady_client(url: str) -> AsyncIterator[Steady]:
    """A ``Steady`` client running meanwhile; checked (it made progress during the
    block, lost nothing) after it."""
    client = Steady(url)
    task = asyncio.create_task(client.run())
    async with asyncio.timeout(PATIENCE):
        while not client.acked:  # noqa: ASYNC110 (a task appends)
            await asyncio.sleep(0.01)
    before = len(client.acked)
    try:
        yield client
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled(), task.exception()
    assert len(client.acked) > before  # it was served while the bad peer was
    await client.check()


async def node_status(url: str) -> NodeStatus:
    async with asyncio.timeout(PATIENCE):
        return await fetch_status(url)


def connection_of(status: NodeStatus, port: int) -> ConnectionStatus | None:
    found = [c for c in status.connections if c.peer == f"127.0.0.1:{port}"]
    return found[0] if found else None


async def watch(url: str, port: int, seen: Callable[[ConnectionStatus], None]) -> None:
    """Call ``seen`` with the status of the connection from ``port`` until it is gone."""
    async with asyncio.timeout(PATIENCE):
        while (connection := connection_of(await node_status(url), port)) is not None:
            seen(connection)
            await asyncio.sleep(0.02)


# -- the tests ---------------------------------------------------------------------------


async def test_a_writer_to_a_peer_that_does_not_read_counts_its_queue_and_closes() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer = FrameWriter(client, high_water=1 << 20)
        assert writer.writable
        item = b"\x00" * (1 << 20)
        for _ in range(40):  # far more than the kernel's buffers on both sides hold
            writer.send(item)
        assert not writer.writable
        assert writer.over_since is not None
        assert writer.queued_bytes == 40 << 20
        for _ in range(10):
            await asyncio.sleep(0.01)  # a frame leaves for the kernel's buffers, and stays
        assert writer.queued_bytes == 40 << 20  # counted until the peer took it
        assert not writer.writable
        async with asyncio.timeout(10):  # the peer takes nothing: the close does not wait
            await writer.aclose(flush_timeout=0.2)
        assert writer.closed
        assert writer.writable  # nobody waits on a closed writer
        assert writer.queued_bytes == 0
    finally:
        client.transport.abort()
        for peer in accepted:
            peer.transport.abort()
        server.close()
        await server.wait_closed()


async def test_a_peer_that_trickles_its_handshake_is_cut_off(node: tuple[str, NodeLog]) -> None:
    url, log = node
    async with steady_client(url), raw_peer(url) as peer:
        hello = frame(p.Hello(1, 1, None, "slow"))
        for byte in hello[:5]:  # never all of it
            peer.sock.sendall(bytes((byte,)))
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(peer.closed_by_node)
        line = await log.wait_for_one_line_about(peer.port)
        assert "no Hello within 1 s" in line


async def test_a_peer_that_trickles_a_frame_is_cut_off(node: tuple[str, NodeLog]) -> None:
    url, log = node
    async with steady_client(url), raw_peer(url) as peer:
        await asyncio.to_thread(peer.hello)
        peer.sock.sendall(p.FRAME_HEADER.pack(100) + b"\x91")

        def trickle() -> bool:
            """A byte every 50 ms (the frame would take 5 s); True once the node closed."""
            try:
                for _ in range(99):
                    peer.sock.sendall(b"\x00")
                    time.sleep(0.05)
                    with contextlib.suppress(BlockingIOError):
                        if peer.sock.recv(1, socket.MSG_DONTWAIT) == b"":
                            return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            return False

        assert await asyncio.to_thread(trickle)
        line = await log.wait_for_one_line_about(peer.port)
        assert "a frame stayed incomplete for 1 s" in line


async def test_a_peer_that_sends_requests_and_reads_no_answers_is_paused_then_cut_off(
    node: tuple[str, NodeLog],
) -> None:
    url, log = node
    async with steady_client(url), raw_peer(url, receive_buffer=4096) as peer:
        await asyncio.to_thread(peer.hello)
        answer = len(_encode(p.StatusIs(1, await node_status(url))))
        requests = frame(*(p.Status(i) for i in range(50)))

        def flood() -> int:
            """Send frames of requests until the node stops reading them."""
            peer.sock.settimeout(0.5)
            sent = 0
            with contextlib.suppress(TimeoutError, ConnectionResetError, BrokenPipeError):
                while True:
                    peer.sock.sendall(requests)
                    sent += 1
            return sent

        flooding = asyncio.create_task(asyncio.to_thread(flood))
        seen: list[ConnectionStatus] = []
        await watch(url, peer.port, seen.append)
        sent = await flooding
        # Megabytes of answers were due: the node held at most its limit, plus the
        # answers to the requests in flight (a Status counts 1 MiB of the 64 MiB allowed
        # in flight) and to one frame read before it saw that.
        assert sent * 50 * answer > 4 * QUEUE
        assert max(c.queued_bytes for c in seen) <= QUEUE + (64 + 50) * 2 * answer
        assert any(c.reading_paused for c in seen)
        line = await log.wait_for_one_line_about(peer.port)
        assert "it took too little of the" in line
        assert "for 1 s (limit 1048576 bytes)" in line


async def test_a_reader_that_stops_reading_holds_a_bounded_queue_and_is_cut_off(
    node: tuple[str, NodeLog],
) -> None:
    """A half-open peer: it opened a stream with all the credit there is, then neither
    reads nor writes. The node does not buffer the log for it, and lets it go."""
    url, log = node
    pchannel = f"half-open-{uuid.uuid4().hex[:8]}"
    payload = b"x" * (100 << 10)
    async with (
        steady_client(url),
        raw_peer(url, receive_buffer=4096) as peer,
        await walsvc.open_wal(url, pchannel) as writer,
        await walsvc.open_wal(url, pchannel, read_only=True, window_bytes=256 << 10) as other,
    ):
        await asyncio.to_thread(peer.hello)
        handle = await asyncio.to_thread(peer.open, pchannel)
        await asyncio.to_thread(peer.read, handle, 1, (p.MAX_CREDIT, p.MAX_CREDIT))
        seen: list[ConnectionStatus] = []
        watching = asyncio.create_task(watch(url, peer.port, seen.append))
        flowing = other.read()
        for _ in range(10):  # 10 MiB: more than the kernel's buffers and the node's limit
            await writer.append_many([Message(payload=payload, vchannel="v")] * 10)
        assert len(await take(flowing, 100, within=PATIENCE)) == 100  # another reader is not slowed
        await watching
        streams = [s for c in seen for s in c.streams]
        assert any(s.waiting_for_send for s in streams)
        assert max(c.queued_bytes for c in seen) <= QUEUE + (1 << 20) + (64 << 10)
        assert max(s.delivered for s in streams) < 100
        line = await log.wait_for_one_line_about(peer.port)
        assert "it took too little of the" in line
        status = await node_status(url)
        assert [c.handles for c in status.connections if c.peer.endswith(f":{peer.port}")] == []
        (channel,) = [c for c in status.pchannels if c.pchannel == pchannel]
        assert channel.handles == 2  # the writer's and the other reader's: nothing leaked
        await flowing.aclose()


@pytest.mark.parametrize(
    ("credits", "why"),
    [
        ([(-1, 0)], "negative"),
        ([(0, p.MAX_CREDIT + 1)], "above the maximum"),
        ([(p.MAX_CREDIT, 0), (1, 0)], "adding up above the maximum"),
    ],
)
async def test_a_peer_granting_absurd_credit_is_disconnected(
    node: tuple[str, NodeLog], credits: list[tuple[int, int]], why: str
) -> None:
    url, log = node
    async with steady_client(url), raw_peer(url) as peer:
        await asyncio.to_thread(peer.hello)
        handle = await asyncio.to_thread(peer.open, f"credit-{uuid.uuid4().hex[:8]}")
        await asyncio.to_thread(peer.read, handle, 1, (10, 1000))
        peer.sock.sendall(frame(*(p.Credit(1, m, b) for m, b in credits)))
        assert await asyncio.to_thread(peer.closed_by_node), why
        line = await log.wait_for_one_line_about(peer.port)
        assert "disconnected" in line


async def test_a_silent_peer_is_cut_off_with_an_idle_timeout() -> None:
    with logged_node(*LIMITS, "--idle-timeout", "1") as (url, log):
        async with steady_client(url), raw_peer(url) as peer:
            await asyncio.to_thread(peer.hello)
            assert await asyncio.to_thread(peer.closed_by_node)
            line = await log.wait_for_one_line_about(peer.port)
            assert "it sent nothing for 1 s" in line


_PRODUCER = """
import asyncio, sys
import walsvc
async def main(url, pchannel):
    async with await walsvc.open_wal(url, pchannel) as wal:
        async def batches(task):
            for seq in range(10**6):
                names = [f"{task}-{seq}-{i}" for i in range(10)]
                await wal.append_many(
                    [walsvc.Message(payload=n.encode(), vchannel="v") for n in names]
                )
                print("\\n".join(names), flush=True)
        await asyncio.gather(*(batches(t) for t in range(8)))
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_client_killed_mid_batch_loses_nothing_acknowledged(
    node: tuple[str, NodeLog],
) -> None:
    url, log = node
    pchannel = f"killed-{uuid.uuid4().hex[:8]}"
    logged = len(log.lines)
    async with steady_client(url):
        producer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _PRODUCER, url, pchannel, cwd=ROOT, stdout=subprocess.PIPE
        )
        assert producer.stdout is not None
        acked: list[bytes] = []
        async with asyncio.timeout(PATIENCE):
            while len(acked) < 500:
                acked.append((await producer.stdout.readline()).strip())
        os.kill(producer.pid, signal.SIGKILL)  # appends in flight, a batch half printed
        await producer.wait()

        def gone(status: NodeStatus) -> bool:
            return not any(h.pchannel == pchannel for c in status.connections for h in c.handles)

        async with asyncio.timeout(PATIENCE):
            while not gone(await node_status(url)):  # noqa: ASYNC110 (polled over the wire)
                await asyncio.sleep(0.02)
        async with await walsvc.open_wal(url, pchannel, read_only=True) as reader:
            latest = await reader.latest_message_id()
            assert latest is not None
            log_payloads = []
            async with asyncio.timeout(PATIENCE):
                async for message in reader.read(DeliverPolicy.all(), raw=True):
                    if not message.type.is_system:  # the last may be a TimeTick
                        log_payloads.append(message.payload)
                    if message.message_id == latest:
                        break
    assert len(set(log_payloads)) == len(log_payloads)  # each at most once
    assert set(acked) <= set(log_payloads)  # every acknowledged one
    assert log.lines[logged:] == []  # a client that goes away breaks no rule


async def test_a_client_refuses_a_window_the_node_would_refuse(node: tuple[str, NodeLog]) -> None:
    url, _ = node
    with pytest.raises(walsvc.InvalidArgument, match=r"window_bytes must be an int in 1\.\."):
        await walsvc.open_wal(url, "p", window_bytes=p.MAX_CREDIT + 1)


def test_limits_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(walsvc.InvalidArgument, match="stall_timeout must be"):
        walsvc.NodeLimits(stall_timeout=0)
    with pytest.raises(walsvc.InvalidArgument, match="max_in_flight must be"):
        walsvc.NodeLimits(max_in_flight=0)
    assert main(["serve", "--url", "memory://x", "--frame-timeout", "-1"]) == 2
    assert "--frame-timeout: must be a number of seconds above 0" in capsys.readouterr().err
