"""A node against peers that break the rules: what it queues for a peer that does not
read is bounded, and such a peer is cut off; a peer that stalls mid-frame is too.
tests/test_remote_wal.py covers garbage, an absurd length prefix and a frame over the
limit.
"""

from __future__ import annotations

import asyncio

from walsvc.remote._frames import FrameWriter


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
        for _ in range(50):
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
