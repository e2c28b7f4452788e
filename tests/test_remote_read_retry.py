"""A read the node cannot serve for a moment: the node's scanner failed (its backend
unreachable) while the connection stays up, so the node ends the stream with
``BACKEND_UNAVAILABLE`` without going away. A client that reconnects sends the stream's
``Read`` again on the same socket, with backoff, and the reader sees every message once,
in order; past ``reconnect_timeout`` it gets the error, as a local reader would at once.
Before, the client kept such a stream for a next socket that never came: the reader
waited for good.

The faults come from ``tests/_faulty.py`` (a memory backend whose scanners fail on
command), served in-process over a real socket; the node keeps no tail cache, so every
read goes to the backend."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator

import _faulty
import msgspec
import pytest
from _tcp_proxy import proxied

import scanners
import walsvc
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.core._metrics import CLIENT
from walsvc.remote import _protocol as p

COUNT = 20
ROUNDS = 2 * int(os.environ.get("WALSVC_SOAK", "1"))
PRODUCED = 200


@pytest.fixture
async def node() -> AsyncIterator[str]:
    _faulty.register()
    async with walsvc.serve(f"{_faulty.SCHEME}://{uuid.uuid4().hex}", tail_cache_bytes=0) as server:
        yield server.node_url
    _faulty.FaultyBackend.read_faults.clear()
    _faulty.FaultyBackend.read_gates.clear()
    _faulty.FaultyBackend.close_gates.clear()


async def _appended(node: str, pchannel: str) -> None:
    async with await walsvc.open_wal(node, pchannel) as wal:
        await wal.append_many([Message(payload=b"%d" % i, vchannel="v") for i in range(COUNT)])


async def _first(scanner: walsvc.Scanner, count: int) -> list[walsvc.ImmutableMessage]:
    """The first ``count`` messages ``scanner`` delivers (it goes on after them)."""
    got: list[walsvc.ImmutableMessage] = []
    async for message in scanner:
        got.append(message)
        if len(got) == count:
            break
    return got


async def _payloads(scanner: walsvc.Scanner, *, ack: bool) -> list[int]:
    got: list[int] = []
    async with asyncio.timeout(20):
        async for message in scanner:
            if message.type is MessageType.INSERT:
                got.append(int(message.payload))
                if ack:
                    await scanner.ack(message)
                if len(got) == COUNT:
                    break
    return got


@pytest.mark.parametrize("subscription", [None, "s"])
async def test_a_read_the_node_cannot_serve_for_a_moment_goes_on(
    node: str, subscription: str | None
) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan = ["ok"] * 5 + ["unavailable"] * 4 + ["ok"] * 3 + ["unavailable"]
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    read_again = CLIENT.streams_read_again
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=10) as wal:
        scanner = wal.read(DeliverPolicy.all(), subscription=subscription)
        async with scanner:
            got = await _payloads(scanner, ack=subscription is not None)
    assert got == list(range(COUNT))
    assert plan == []  # every injected failure was met
    assert CLIENT.streams_read_again - read_again == 5  # one Read again per failure


async def test_a_read_the_node_cannot_serve_ends_after_reconnect_timeout(node: str) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    _faulty.FaultyBackend.read_faults[pchannel] = ["ok"] * 3 + ["unavailable"] * 10_000
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=0.5) as wal:
        async with wal.read(DeliverPolicy.all()) as scanner:
            with pytest.raises(walsvc.BackendUnavailable, match="read again"):
                await _payloads(scanner, ack=False)
        assert await wal.latest_message_id() is not None  # the connection is fine


async def test_without_reconnecting_a_failed_read_ends_at_once(node: str) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan = ["ok", "unavailable", "ok"]
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=0) as wal:
        async with wal.read(DeliverPolicy.all()) as scanner:
            with pytest.raises(walsvc.BackendUnavailable, match="injected: the read failed"):
                await _payloads(scanner, ack=False)
    assert plan == ["ok"]


async def test_a_read_that_ran_a_while_before_it_failed_again_goes_on(node: str) -> None:
    """``reconnect_timeout`` bounds a run of failures, not the stream's life: a resumed
    read that stood (here: waited longer than ``reconnect_timeout`` for its broker) before
    it failed again is read once more."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan = ["ok"] * 3 + ["timeout"] * 3
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=0.5) as wal:
        async with wal.read(DeliverPolicy.all()) as scanner:
            got = await _payloads(scanner, ack=False)
    assert got == list(range(COUNT))
    assert plan == []


async def _collect(
    scanner: walsvc.Scanner, want: int, *, ack: bool = False
) -> list[walsvc.ImmutableMessage]:
    got: list[walsvc.ImmutableMessage] = []
    async with asyncio.timeout(60), scanner:
        async for message in scanner:
            if message.type is MessageType.INSERT:
                got.append(message)
                if ack:
                    await scanner.ack(message)
                if len(got) == want:
                    break
    return got


async def _relay(wal: walsvc.WAL, want: int, seed: random.Random) -> list[walsvc.ImmutableMessage]:
    """Readers of subscription "t" one after the other: each acknowledges every message
    it gets, flushes now and then, and closes after a few (1 to 40); the next one
    starts after the last acknowledged."""
    got: list[walsvc.ImmutableMessage] = []
    while len(got) < want:
        take = seed.randint(1, 40)
        async with asyncio.timeout(60), wal.read(subscription="t") as scanner:
            async for message in scanner:
                if message.type is MessageType.INSERT:
                    got.append(message)
                    await scanner.ack(message)
                    if seed.random() < 0.1:
                        await scanner.flush()
                    take -= 1
                    if take == 0 or len(got) == want:
                        break
    return got


@pytest.mark.slow
async def test_readers_see_the_log_once_in_order_through_random_read_failures(
    node: str, seed: random.Random
) -> None:
    """Seeded: while producers append, the node's reads of the log fail at random
    points (and stall a while before failing, at times). A reader from the start, one of
    vchannel "v" alone, one from after a known message, a subscription reader that
    acknowledges each message, and a relay of subscription readers that each close
    after a few messages (flushing now and then) all get their share of the log exactly
    once, in order."""
    for _ in range(ROUNDS):
        pchannel = f"p-{uuid.uuid4().hex[:10]}"
        async with await walsvc.open_wal(node, pchannel, reconnect_timeout=30) as wal:
            first = await wal.append(Message(payload=b"first", vchannel="v"))
            plan = [
                seed.choices(["ok", "unavailable", "stall"], [0.8, 0.17, 0.03])[0]
                for _ in range(400)
            ]
            _faulty.FaultyBackend.read_faults[pchannel] = plan
            readers = [
                _collect(wal.read(DeliverPolicy.all()), 1 + PRODUCED),
                _collect(
                    wal.read(DeliverPolicy.all(), [scanners.vchannel("v")]), 1 + PRODUCED // 2
                ),
                _collect(wal.read(DeliverPolicy.start_after(first.message_id)), PRODUCED),
                _collect(wal.read(DeliverPolicy.all(), subscription="s"), 1 + PRODUCED, ack=True),
                _relay(wal, 1 + PRODUCED, random.Random(seed.random())),
            ]

            async def produce() -> None:
                for i in range(0, PRODUCED, 10):
                    await wal.append_many(
                        Message(payload=b"%d" % n, vchannel="vw"[n % 2]) for n in range(i, i + 10)
                    )
                    await asyncio.sleep(seed.uniform(0, 0.01))

            *seen, _ = await asyncio.gather(*readers, produce())
            log = await _collect(wal.read(DeliverPolicy.all()), 1 + PRODUCED)
        ids = [m.message_id for m in log]
        assert [m.message_id for m in seen[0]] == ids
        assert [m.message_id for m in seen[1]] == [m.message_id for m in log if m.vchannel == "v"]
        assert [m.message_id for m in seen[2]] == ids[1:]
        assert [m.message_id for m in seen[3]] == ids
        assert [m.message_id for m in seen[4]] == ids
        assert len(plan) < 400, "the readers never met the plan"


async def test_a_subscription_closed_while_its_read_fails_writes_its_last_ack(node: str) -> None:
    """A subscription reader acknowledges a message and closes while the node's read of
    the log fails (the node has no stream to take the ack or the close): the close
    waits for the stream read again, sends the ack there, then closes it, so the next
    reader of the subscription starts after the acknowledged message."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan: list[str] = []  # reads go as usual until it says otherwise
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=10) as wal:
        scanner = wal.read(DeliverPolicy.all(), subscription="s", checkpoint_interval=3600)
        async with asyncio.timeout(20):
            got = await _first(scanner, 5)
            plan += ["unavailable"] * 8  # read again for about 1.3 s from the next read
            await wal.append(Message(payload=b"more", vchannel="v"))  # the node reads on
            while not scanner._suspended:  # noqa: ASYNC110 (the node ended the stream)
                await asyncio.sleep(0.002)
            assert len(plan) > 2  # the stream is read again for a while yet
            await scanner.ack(got[-1])
            await scanner.aclose()
        assert plan == []  # the close waited for the stream read again
        async with asyncio.timeout(20), wal.read(subscription="s") as again:
            first = await anext(again)
    assert first.payload == b"5"


@pytest.mark.parametrize("closing", [False, True], ids=["ended", "closing-its-scanner"])
async def test_a_close_that_meets_the_stream_ended_by_the_node_goes_again(
    node: str, closing: bool
) -> None:
    """The node's read fails while a subscription's ack and close are on their way (held
    in a proxy): the node ends the stream and drops the ack (no stream takes it). The
    close comes when the node has ended the stream, or while it still closes the
    stream's scanner (which it then does not cut short: it closes it whole and ends
    the stream before it answers). Either way the answer comes after the end and does
    not count: the close waits for the stream read again, sends the ack there and
    closes it, so the next reader of the subscription starts after the acknowledged
    message."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan: list[str] = []
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    gate = _faulty.FaultyBackend.read_gates[pchannel] = _faulty.Gate()
    close_gate = _faulty.FaultyBackend.close_gates[pchannel] = _faulty.Gate()
    if not closing:
        close_gate.opened.set()
    async with proxied(node) as (proxy, url):
        async with await walsvc.open_wal(url, pchannel, reconnect_timeout=10) as wal:
            scanner = wal.read(DeliverPolicy.all(), subscription="s", checkpoint_interval=3600)
            async with asyncio.timeout(20):
                got = await _first(scanner, 5)
                plan.append("gated")
                await wal.append(Message(payload=b"more", vchannel="v"))  # the node reads on
                await gate.reached.wait()
                proxy.hold("up")
                await scanner.ack(got[-1])
                closing_task = asyncio.ensure_future(scanner.aclose())
                conn = wal._conn  # type: ignore[attr-defined]
                while not any(isinstance(q.item, p.Flush) for q in conn._pending.values()):  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
                gate.opened.set()  # the node's read fails: it ends the stream
                if closing:
                    await close_gate.reached.wait()
                    proxy.release()  # the close reaches the node as it closes the scanner
                    await wal.latest_message_id()  # answered behind the close: it was taken
                    close_gate.opened.set()
                else:
                    while not scanner._suspended:  # noqa: ASYNC110
                        await asyncio.sleep(0.002)
                    proxy.release()
                await closing_task
            async with asyncio.timeout(20), wal.read(subscription="s") as again:
                first = await anext(again)
    assert first.payload == b"5"


async def test_a_stream_closed_as_its_read_fails_ends_once(node: str) -> None:
    """A raw peer closes a stream while the node, its read failed, still closes the
    stream's scanner (the ``Pong`` to a ``Ping`` sent behind the ``CloseStream`` says
    the node took the close): the node waits for that close and answers with the one
    ``StreamEnded`` the stream's end sent (the read's error), not a second one."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    _faulty.FaultyBackend.read_faults[pchannel] = ["gated"]
    gate = _faulty.FaultyBackend.read_gates[pchannel] = _faulty.Gate()
    close_gate = _faulty.FaultyBackend.close_gates[pchannel] = _faulty.Gate()
    host, _, port = node.removeprefix("walsvc://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder = msgspec.msgpack.Decoder(list[p.NodeMessage])

    def send(*messages: msgspec.Struct) -> None:
        body = p.array_header(len(messages)) + b"".join(map(msgspec.msgpack.encode, messages))
        writer.write(p.FRAME_HEADER.pack(len(body)) + body)

    async def until(kind: type[msgspec.Struct]) -> list[p.NodeMessage]:
        """The messages of the frames received up to one with a ``kind``."""
        seen: list[p.NodeMessage] = []
        while not any(isinstance(message, kind) for message in seen):
            (length,) = p.FRAME_HEADER.unpack(await reader.readexactly(4))
            seen += decoder.decode(await reader.readexactly(length))
        return seen

    try:
        async with asyncio.timeout(20):
            send(p.Hello(1, p.NODE_VERSIONS[1], None, "raw"))
            await until(p.Welcome)
            send(p.OpenWal(1, pchannel, False))
            (opened,) = await until(p.Opened)
            assert isinstance(opened, p.Opened)
            read = p.Read(
                1, opened.wal, "all", None, 0, None, None, 0, False, False, 0, 100, 1 << 20
            )
            send(read)
            await gate.reached.wait()
            gate.opened.set()  # the read fails: the node closes the stream's scanner
            await close_gate.reached.wait()
            send(p.CloseStream(1), p.Ping(7))
            seen = await until(p.Pong)  # the node took the close as the scanner closes
            close_gate.opened.set()
            if not any(isinstance(message, p.StreamEnded) for message in seen):
                seen += await until(p.StreamEnded)
            send(p.Ping(8))
            seen += await until(p.Pong)
    finally:
        writer.close()
    ended = [m for m in seen if isinstance(m, p.StreamEnded)]
    assert [(m.stream, m.code) for m in ended] == [(1, p.ErrorCode.BACKEND_UNAVAILABLE)]
