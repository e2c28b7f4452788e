"""``walsvc.remote._buffered``: asyncio streams whose reads go into a reused buffer (the
node's and the clients' connections). They carry what asyncio's streams carry, in order,
across many reads of the buffer's size, and end as theirs do."""

from __future__ import annotations

import asyncio
import random

import pytest

from walsvc.remote._buffered import READ_SIZE, open_connection, start_server


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    assert isinstance(writer.transport.get_protocol(), asyncio.BufferedProtocol)
    while data := await reader.read(1 << 20):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_a_connection_carries_every_byte_in_order_and_ends(seed: random.Random) -> None:
    rng = seed
    sent = rng.randbytes(8 * READ_SIZE + 123)
    server = await start_server(_echo, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await open_connection("127.0.0.1", port)
        assert isinstance(writer.transport.get_protocol(), asyncio.BufferedProtocol)
        at = 0
        while at < len(sent):  # writes of every size, up to several reads' worth
            size = rng.choice((1, 17, READ_SIZE - 1, READ_SIZE, 3 * READ_SIZE))
            writer.write(sent[at : at + size])
            at += size
        writer.write_eof()
        async with asyncio.timeout(30):
            echoed = await reader.read()  # to the end of the stream: the server closed
        assert echoed == sent
        assert reader.at_eof()
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


async def test_readexactly_spans_reads_and_reports_a_short_stream() -> None:
    async def send_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"x" * (READ_SIZE + 10))
        await writer.drain()
        writer.close()

    server = await start_server(send_and_close, "127.0.0.1", 0)
    try:
        reader, writer = await open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        async with asyncio.timeout(30):
            assert await reader.readexactly(READ_SIZE + 5) == b"x" * (READ_SIZE + 5)
            with pytest.raises(asyncio.IncompleteReadError) as short:
                await reader.readexactly(10)
            assert short.value.partial == b"x" * 5
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
