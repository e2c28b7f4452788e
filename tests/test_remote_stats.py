"""A remote scanner's ``stats()`` over walsvc://: the node's scanner's stages, sent by a
node in a subprocess (memory:// and file://) as ``StreamStats`` on connections that
negotiated protocol version 2, merged with what the client delivered. A tailing reader
reads the node's tail cache; a reader that starts behind reads the backend, then hands
off to the cache; a subscription shows its durable checkpoint (after ``flush`` at once,
after an ``ack`` once written); open transactions show while they are held; counters
add up across a reconnect. A client or a peer that speaks version 1 still interoperates
and never receives a ``StreamStats``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import msgspec
import pytest
from _chain_support import take
from _tcp_proxy import TcpProxy

import walsvc
from walsvc import DeliverPolicy, Filter, Message
from walsvc.remote import _protocol as p
from walsvc.remote._client import RemoteWAL


def _pchannel() -> str:
    return f"st-{uuid.uuid4().hex[:10]}"


def _messages(count: int, vchannel: str = "v") -> list[Message]:
    return [Message(payload=b"m%d" % i, vchannel=vchannel) for i in range(count)]


async def _until(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    try:
        async with asyncio.timeout(within):
            while not condition():  # noqa: ASYNC110 (stats() is a snapshot: nothing to wait on)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {within} s: {what}") from None


async def _tailing(wal: walsvc.WAL) -> walsvc.Scanner:
    """A ``latest`` reader that the node serves from its tail cache. One opened while an
    append is in flight (the TimeTick the node's WAL writes when it opens, and ~10 ms
    after appends) starts on the backend, rightly: the cache cannot vouch for what
    precedes an append in flight. Such a one is closed and opened again."""
    async with asyncio.timeout(10):
        while True:
            scanner = wal.read(DeliverPolicy.latest())
            while scanner.stats().source == "not started":  # noqa: ASYNC110 (a snapshot)
                await asyncio.sleep(0.01)
            if scanner.stats().source == "cache":
                return scanner
            await scanner.aclose()
            await asyncio.sleep(0.05)


async def test_a_tailing_reader_reports_the_node_tail_cache(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        assert isinstance(wal, RemoteWAL)
        assert wal.connection.version == 3
        scanner = await _tailing(wal)
        results = await wal.append_many(_messages(20))
        got = await take(scanner, 20)
        stats = scanner.stats()
        assert stats.source == "cache"
        assert (stats.handoffs, stats.fallbacks, stats.rejected) == (0, 0, 0)
        assert (stats.held_for_order, stats.open_txns, stats.txn_bytes) == (0, 0, 0)
        assert stats.delivered == 20
        assert stats.position == got[-1].message_id == results[-1].message_id
        assert stats.checkpoint is None
        await scanner.aclose()


async def test_a_reader_behind_the_cache_reads_the_backend_then_hands_off(node: str) -> None:
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as wal:
        # Appended while no scanner is open: the node's tail cache holds none of them.
        results = []
        for _ in range(20):
            results += await wal.append_many(_messages(100))
        async with await walsvc.open_wal(
            node, pchannel, read_only=True, window_messages=64
        ) as reader:
            scanner = reader.read(DeliverPolicy.all())
            # Nothing from the node yet (read sends the Read; no frame was handled since).
            assert scanner.stats().source == "not started"
            (first,) = await take(scanner, 1)
            stats = scanner.stats()
            # The node is at most a window ahead: still on the backend, no hand-off yet.
            assert stats.source == "backend"
            assert (stats.handoffs, stats.fallbacks) == (0, 0)
            assert first.message_id == results[0].message_id
            # What the client handed over: the batch of ``first`` (as a local scanner counts).
            assert 1 <= stats.delivered <= 64
            assert stats.position == results[stats.delivered - 1].message_id
            rest = await take(scanner, len(results) - 1)
            assert rest[-1].message_id == results[-1].message_id
            # Nothing more to read: the node's scanner hands off to the cache, and says so
            # within 100 ms though it delivers nothing.
            await _until(lambda: scanner.stats().source == "cache", "the hand-off once caught up")
            assert scanner.stats().handoffs == 1
            # Caught up: what is appended now comes from the cache, after one hand-off.
            new = await wal.append_many(_messages(5))
            got = await take(scanner, 5)
            assert [m.message_id for m in got] == [r.message_id for r in new]
            stats = scanner.stats()
            assert stats.source == "cache"
            assert (stats.handoffs, stats.fallbacks) == (1, 0)
            assert stats.delivered == len(results) + 5
            assert stats.position == new[-1].message_id
            await scanner.aclose()


async def test_a_subscription_shows_its_durable_checkpoint(node: str) -> None:
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as wal:
        await wal.append_many(_messages(40))
        scanner = wal.read(DeliverPolicy.all(), subscription="stats", checkpoint_interval=0.05)
        assert scanner.stats().checkpoint is None
        first = await take(scanner, 10)
        await scanner.ack(first[-1])
        await scanner.flush()  # the node reports the checkpoint it wrote ahead of Done
        assert scanner.stats().checkpoint == first[-1].checkpoint
        await asyncio.sleep(0.3)  # a look the deliveries scheduled is over
        second = await take(scanner, 10)
        await scanner.ack(second[-1])  # no flush: the node reports it once written
        await _until(
            lambda: scanner.stats().checkpoint == second[-1].checkpoint,
            f"the acknowledged checkpoint {second[-1].checkpoint}, got {scanner.stats()}",
        )
        await scanner.aclose()
        # The next reader of the name: the checkpoint it starts from, before it delivers.
        async with await walsvc.open_wal(node, pchannel, read_only=True) as other:
            again = other.read(subscription="stats")
            await _until(lambda: again.stats().source != "not started", "the stream's start")
            assert again.stats().checkpoint == second[-1].checkpoint
            (resumed,) = await take(again, 1)
            assert resumed.payload == b"m20"
            await again.aclose()


async def test_a_subscription_that_delivers_nothing_reports_its_start(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        await wal.append(Message(payload=b"old", vchannel="v"))
        scanner = wal.read(DeliverPolicy.latest(), subscription="quiet")
        assert scanner.stats().source == "not started"
        # Its scanner on the node starts (loads the checkpoint) after the first report.
        await _until(lambda: scanner.stats().source != "not started", "the subscription's start")
        assert scanner.stats().source in ("cache", "backend")
        assert scanner.stats().delivered == 0
        await scanner.aclose()


async def test_an_open_transaction_shows_while_the_node_holds_it(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        scanner = await _tailing(wal)
        txn = await wal.begin_txn("t")
        await txn.append(Message(payload=b"x" * 100, vchannel="t"))
        await wal.append(Message(payload=b"other", vchannel="a"))
        (other,) = await take(scanner, 1)
        assert other.payload == b"other"
        await _until(
            lambda: scanner.stats().open_txns == 1 and scanner.stats().txn_bytes >= 100,
            f"one open transaction of 100 bytes, got {scanner.stats()}",
        )
        # Held by the node while nothing is delivered: the node looks again while a
        # transaction is open.
        await txn.append_many([Message(payload=b"y" * 100, vchannel="t") for _ in range(2)])
        await _until(
            lambda: scanner.stats().txn_bytes >= 300,
            f"one open transaction of 300 bytes, got {scanner.stats()}",
        )
        await txn.commit()
        (committed,) = await take(scanner, 1)
        assert committed.type is walsvc.MessageType.TXN
        await _until(
            lambda: scanner.stats().open_txns == 0 and scanner.stats().txn_bytes == 0,
            f"no open transaction, got {scanner.stats()}",
        )
        await scanner.aclose()


async def test_counters_add_up_across_a_reconnect(node: str, proxy: tuple[TcpProxy, str]) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as wal:
        await wal.append_many(_messages(200))  # not in the cache: the reader hands off
        # A reader that keeps the node's cache active (a cache with no reader holds
        # nothing), so that the resumed stream starts in the cache.
        keeper = wal.read(DeliverPolicy.latest())
        async with await walsvc.open_wal(url, pchannel, read_only=True) as reader:
            assert isinstance(reader, RemoteWAL)
            scanner = reader.read(DeliverPolicy.all())
            await take(scanner, 200)
            cached = await wal.append(Message(payload=b"cached", vchannel="v"))
            (last,) = await take(scanner, 1)
            received = 201
            # The stream resumes from its last message's checkpoint: from its
            # last-confirmed id, which a later append names in the cache too.
            while last.last_confirmed_id is None or last.last_confirmed_id < cached.message_id:
                await wal.append(Message(payload=b"cached", vchannel="v"))
                (last,) = await take(scanner, 1)
                received += 1
            assert (scanner.stats().source, scanner.stats().handoffs) == ("cache", 1)
            tcp.cut()  # the stream resumes on a new socket, with a new node scanner
            await wal.append(Message(payload=b"after", vchannel="v"))
            (after,) = await take(scanner, 1)
            assert after.payload == b"after"
            assert reader.connection.reconnects == 1
            await _until(lambda: scanner.stats().source == "cache", "the resumed stream's stats")
            stats = scanner.stats()
            # The new node scanner started in the cache: the earlier hand-off still counts.
            assert stats.handoffs == 1
            assert stats.delivered == received + 1
            assert stats.position == after.message_id
            await scanner.aclose()
        await keeper.aclose()


async def test_a_client_that_speaks_version_1_reads_as_before(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel(), versions=(1, 1)) as wal:
        assert isinstance(wal, RemoteWAL)
        assert wal.connection.version == 1
        scanner = wal.read(DeliverPolicy.all(), [Filter(vchannels=["v"])])
        results = await wal.append_many(_messages(30))
        got = await take(scanner, 30)
        assert [m.message_id for m in got] == [r.message_id for r in results]
        await asyncio.sleep(0.3)  # a node that sent StreamStats would have by now
        stats = scanner.stats()
        assert stats.source == "node"
        assert (stats.handoffs, stats.fallbacks, stats.rejected, stats.open_txns) == (0, 0, 0, 0)
        assert stats.delivered == 30
        assert stats.position == results[-1].message_id
        await scanner.aclose()


#: What a client of protocol version 1 decodes: every node message but ``StreamStats``.
_V1NodeMessage = (
    p.Welcome
    | p.Refused
    | p.Opened
    | p.Appended
    | p.Failed
    | p.LatestIdIs
    | p.Delivered
    | p.StreamEnded
    | p.Done
    | p.StreamStarted
    | p.Pong
    | p.StatusIs
    | p.GoingAway
    | p.TxnBegun
    | p.AckFailed
)


@pytest.mark.parametrize("version", [1, 2])
async def test_a_raw_peer_receives_stream_stats_only_from_version_2(
    node: str, version: int
) -> None:
    """A peer that knows only version 1's messages (decoding with them alone) reads a
    stream; the node sends it nothing else. The same peer saying version 2 gets
    ``StreamStats`` ahead of its deliveries."""
    host, _, port = node.removeprefix("walsvc://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    encode = msgspec.msgpack.encode
    strict = msgspec.msgpack.Decoder(list[_V1NodeMessage])
    every = msgspec.msgpack.Decoder(list[p.NodeMessage])

    def send(*messages: msgspec.Struct) -> None:
        body = p.array_header(len(messages)) + b"".join(encode(m) for m in messages)
        writer.write(p.FRAME_HEADER.pack(len(body)) + body)

    async def frame() -> list[p.NodeMessage]:
        async with asyncio.timeout(10):
            (length,) = p.FRAME_HEADER.unpack(await reader.readexactly(4))
            body = await reader.readexactly(length)
        if version == 1:
            return list(strict.decode(body))  # a StreamStats here fails the test
        return every.decode(body)

    try:
        send(p.Hello(1, version, None, "raw"))
        (welcome,) = await frame()
        assert isinstance(welcome, p.Welcome)
        assert (welcome.version, welcome.min_version, welcome.max_version) == (version, 1, 3)
        send(p.OpenWal(1, _pchannel(), False))
        (opened,) = await frame()
        assert isinstance(opened, p.Opened)
        message = p.WireMessage(b"x", "v", 10000, {}, None)
        send(p.Append(2, opened.wal, message))  # the writer is ready once it is answered
        (appended,) = await frame()
        assert isinstance(appended, p.Appended)
        send(
            p.Read(
                1, opened.wal, "latest", None, 0, None, None, 0, False, False, 1 << 20, 100, 1 << 20
            )
        )
        send(p.AppendMany(3, opened.wal, [message] * 5))
        seen: list[p.NodeMessage] = []
        delivered = 0
        while delivered < 5:
            for message in await frame():
                seen.append(message)
                if isinstance(message, p.Delivered):
                    delivered += len(message.messages)
        stats = [m for m in seen if isinstance(m, p.StreamStats)]
        if version == 1:
            assert stats == []
        else:
            assert stats, seen
            assert stats[0].stream == 1
            assert stats[-1].source in ("cache", "backend")
            assert seen.index(stats[0]) < min(
                i for i, m in enumerate(seen) if isinstance(m, p.Delivered)
            )
    finally:
        writer.close()
