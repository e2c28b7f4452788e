"""Protocol v1 and v2 (docs/protocol.md): the error table, version negotiation, frame
layout and batching, and the byte forms the document shows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest

import walsvc
from walsvc.remote import _protocol as p
from walsvc.remote._frames import FRAME_ITEMS, FrameTooLarge, FrameWriter, read_frame


def test_every_error_code_maps_to_one_walsvc_error_and_back() -> None:
    codes = {value for name, value in vars(p.ErrorCode).items() if name.isupper()} - {
        p.ErrorCode.OK,
        p.ErrorCode.PROTOCOL_ERROR,  # the node's complaint about the peer: no client error
    }
    for code in codes:
        error = p.error_from(code, "node said so")
        assert str(error) == "node said so"
        assert p.error_code(error) == code
    named = {type(p.error_from(code, "")).__name__ for code in codes}
    errors = {
        name
        for name in walsvc.__all__
        if isinstance(getattr(walsvc, name), type)
        and issubclass(getattr(walsvc, name), walsvc.WALError)
    }
    assert named == errors  # every walsvc error has a code
    assert p.error_code(KeyError("bug")) == p.ErrorCode.WAL_ERROR
    assert type(p.error_from(999, "new")) is walsvc.WALError


@pytest.mark.parametrize(
    ("client", "chosen"),
    [((1, 1), 1), ((0, 5), 1), ((1, 3), 1), ((2, 3), None), ((0, 0), None)],
)
def test_negotiation_picks_the_highest_common_version(
    client: tuple[int, int], chosen: int | None
) -> None:
    assert p.negotiate(client, (1, 1)) == chosen
    assert p.NODE_VERSIONS == (1, 3)
    assert p.negotiate((1, 4), (2, 3)) == 3


def test_this_code_speaks_versions_1_to_3_and_what_came_with_each() -> None:
    assert p.NODE_VERSIONS == (1, 3)
    assert p.STREAM_STATS_VERSION == 2
    assert p.RECALL_VERSION == 3
    assert p.negotiate((1, 1)) == 1  # a version 1 client gets version 1 from this node
    assert p.negotiate((1, 2)) == 2
    assert p.negotiate((1, 3)) == 3
    assert p.negotiate((2, 2), (1, 1)) is None  # a version 2 client insisting, an old node


def test_the_byte_forms_the_document_shows() -> None:
    encode = msgspec.msgpack.encode
    assert encode(p.Hello(1, 1, None, "x")) == b"\x95\x01\x01\x01\xc0\xa1x"
    assert encode(p.Credit(7, 100, 65536)) == b"\x94\x07\x07\x64\xce\x00\x01\x00\x00"
    assert p.array_header(3) == b"\x93"
    assert p.array_header(300) == b"\xdc\x01\x2c"
    assert p.array_header(70000) == b"\xdd\x00\x01\x11\x70"
    decoded = msgspec.msgpack.decode(
        b"\x92" + encode(p.Hello(1, 2, "t", "c")) + encode(p.CloseStream(4)),
        type=list[p.ClientMessage],
    )
    assert decoded == [p.Hello(1, 2, "t", "c"), p.CloseStream(4)]


def test_the_byte_forms_of_transactions_and_subscriptions() -> None:
    encode = msgspec.msgpack.encode
    assert encode(p.Ack(1, 2, None, 3)) == bytes.fromhex("95 2d 01 02 c0 03")
    assert encode(p.TxnBegin(1, 1, "v", 1.0, None, "t")) == bytes.fromhex(
        "97 28 01 01 a1 76 cb 3f f0 00 00 00 00 00 00 c0 a1 74"
    )
    # A version 1 TxnBegin (no token) decodes; so does a TxnCommit without caller, seq.
    assert msgspec.msgpack.decode(
        bytes.fromhex("96 28 01 01 a1 76 cb 3f f0 00 00 00 00 00 00 c0"), type=p.ClientMessage
    ) == p.TxnBegin(1, 1, "v", 1.0, None)
    assert msgspec.msgpack.decode(bytes.fromhex("94 2b 01 01 05"), type=p.ClientMessage) == (
        p.TxnCommit(1, 1, 5)
    )
    # A Read without its last two fields (subscription, checkpoint_interval) decodes.
    short = encode([6, 1, 1, "all", None, 0, None, None, 0, False, False, 0, 1, 1])
    read = msgspec.msgpack.decode(short, type=p.Read)
    assert (read.subscription, read.checkpoint_interval) == (None, 1.0)
    both = msgspec.msgpack.decode(
        b"\x92" + encode(p.Flush(3, 4, True)) + encode(p.TxnResume(5, 1, 9)),
        type=list[p.ClientMessage],
    )
    assert both == [p.Flush(3, 4, True), p.TxnResume(5, 1, 9)]


def test_the_byte_forms_of_stream_stats() -> None:
    encode = msgspec.msgpack.encode
    assert encode(p.Hello(1, 2, None, "x")) == bytes.fromhex("95 01 01 02 c0 a1 78")
    plain = p.StreamStats(1, "cache", 0, 0, 0, 0, 0, 0, None)
    assert encode(plain) == bytes.fromhex("9a 1f 01 a5 63 61 63 68 65 00 00 00 00 00 00 c0")
    checkpointed = p.StreamStats(3, "backend", 1, 0, 0, 0, 0, 0, ("memory:7", 12))
    assert encode(checkpointed) == bytes.fromhex(
        "9a 1f 03 a7 62 61 63 6b 65 6e 64 01 00 00 00 00 00 92 a8 6d 65 6d 6f 72 79 3a 37 0c"
    )
    decoded = msgspec.msgpack.decode(
        b"\x92" + encode(checkpointed) + encode(plain), type=list[p.NodeMessage]
    )
    assert decoded == [checkpointed, plain]
    # Items after the nine fields (a later version's) are ignored.
    longer = encode([31, 1, "cache", 0, 0, 0, 0, 0, 0, None, "later"])
    assert msgspec.msgpack.decode(longer, type=p.StreamStats) == plain


@contextlib.asynccontextmanager
async def _frame_reader(
    reading: asyncio.Event | None = None,
) -> AsyncIterator[tuple[asyncio.StreamWriter, list[bytes], asyncio.Event]]:
    """A peer on loopback that reads frames (once ``reading`` is set, if given) until the
    client closes: yields the client's stream writer, the frame bodies read and an event
    set once the client closed."""
    frames: list[bytes] = []
    done = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if reading is not None:
            await reading.wait()
        try:
            while True:
                frames.append(await read_frame(reader))
        except asyncio.IncompleteReadError:
            done.set()
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield client, frames, done
    finally:
        try:
            if not client.transport.is_closing():  # closed already: asyncio's abort fails
                client.transport.abort()
        finally:
            server.close()
            await server.wait_closed()


async def test_a_writer_batches_a_loop_turn_into_frames_of_at_most_frame_items() -> None:
    async with _frame_reader() as (client, frames, done):
        writer = FrameWriter(client)
        sent: list[int] = []
        burst = 3 * FRAME_ITEMS + 4
        for i in range(burst):  # one loop turn: full frames leave at once, the rest at its end
            writer.send(msgspec.msgpack.encode(p.CloseStream(i)), lambda i=i: sent.append(i))
            if i == FRAME_ITEMS - 1:
                assert sent == list(range(FRAME_ITEMS))  # written before the turn ended
        await asyncio.sleep(0)
        for i in range(burst, burst + 5):  # the next turn's few share one frame
            writer.send(msgspec.msgpack.encode(p.CloseStream(i)), lambda i=i: sent.append(i))
        await writer.aclose()
        await asyncio.wait_for(done.wait(), 10)
    decoded = [msgspec.msgpack.decode(f, type=list[p.ClientMessage]) for f in frames]
    assert [len(f) for f in decoded] == [FRAME_ITEMS] * 3 + [4, 5]
    assert [m for f in decoded for m in f] == [p.CloseStream(i) for i in range(burst + 5)]
    assert sent == list(range(burst + 5))
    assert writer.queued_bytes == 0


async def test_a_writer_holds_what_its_peer_has_not_taken_and_sends_it_in_order_later() -> None:
    """Frames the transport had to buffer (a peer not reading yet) count as queued until
    the transport drained; what is sent meanwhile follows them, in order."""
    reading = asyncio.Event()
    sent = [bytes([i]) * _ITEM for i in range(48)]
    async with _frame_reader(reading) as (client, frames, done):
        writer = FrameWriter(client, high_water=8 * _ITEM)
        for item in sent[:40]:  # a frame a loop turn: far more than the kernel's buffers hold
            writer.send(item)
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0.01)
        assert writer.queued_bytes > 8 * _ITEM  # in the transport, not taken
        assert not writer.writable
        for item in sent[40:]:
            writer.send(item)
        reading.set()
        async with asyncio.timeout(10):
            await writer.wait_writable()  # half the high water or less: it drains
            await writer.aclose()
            assert writer.queued_bytes == 0
            await done.wait()
    assert [item for body in frames for item in _items(body)] == sent


#: The bytes of one item in the writer's queue test.
_ITEM = 1 << 20


def _items(body: bytes) -> list[bytes]:
    """The items of a frame whose items are all ``_ITEM`` bytes long."""
    head = body[0]
    if head & 0xF0 == 0x90:
        count, offset = head & 0x0F, 1
    elif head == 0xDC:
        count, offset = int.from_bytes(body[1:3], "big"), 3
    else:
        count, offset = int.from_bytes(body[1:5], "big"), 5
    return [body[offset + i * _ITEM : offset + (i + 1) * _ITEM] for i in range(count)]


async def test_a_length_prefix_above_the_limit_is_refused_before_the_body() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(p.FRAME_HEADER.pack(p.MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameTooLarge):
        await read_frame(reader)
    reader = asyncio.StreamReader()
    reader.feed_data(p.FRAME_HEADER.pack(3) + b"\x91\x91\x08")
    reader.feed_eof()
    assert await read_frame(reader) == b"\x91\x91\x08"


def test_the_byte_forms_of_recall() -> None:
    encode = msgspec.msgpack.encode
    recall = p.Recall(1, 1, 7, [("v", "k")])
    assert encode(recall) == bytes.fromhex("95 31 01 01 07 91 92 a1 76 a1 6b")
    recalled = p.Recalled(1, [p.WireResult("memory:3", 9, None), None])
    assert encode(recalled) == bytes.fromhex("93 20 01 92 93 a8 6d 65 6d 6f 72 79 3a 33 09 c0 c0")
    assert msgspec.msgpack.decode(encode(recall), type=p.ClientMessage) == recall
    assert msgspec.msgpack.decode(encode(recalled), type=p.NodeMessage) == recalled
