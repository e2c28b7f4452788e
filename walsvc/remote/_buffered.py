"""asyncio streams whose socket reads go into one reused buffer.

``asyncio.open_connection`` and ``asyncio.start_server`` read with ``sock.recv(256 KiB)``
on the stock event loop: each read allocates a 256 KiB bytes object, above glibc's mmap
threshold, so every read, however small, costs an ``mmap``, a ``mremap`` and a
``munmap`` (cpython#85451). Measured here on a socket pair: ``recv(262144)`` of 500 B
9.6 us, of 15 kB 14.7 us; ``recv_into`` a reused buffer 1.4 and 2.8 us. A node and its
clients read a frame per request and per answer, so the streams here read into a
64 KiB buffer of their protocol (``asyncio.BufferedProtocol``: ``recv_into``), and the
``StreamReader`` copies each read out of it as before. Otherwise they are asyncio's
streams, built as ``asyncio.streams`` builds them (TLS included: asyncio's TLS layer
feeds a buffered protocol the same way). uvloop reads into a buffer of its own
either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

__all__ = ("open_connection", "start_server")

#: Bytes one socket read takes at most.
READ_SIZE: Final = 64 * 1024

Connected = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _ReusedBufferProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """``asyncio.StreamReaderProtocol`` reading into one buffer of its own."""

    def __init__(self, reader: asyncio.StreamReader, connected: Connected | None = None) -> None:
        super().__init__(reader, connected)
        self._read_buffer = memoryview(bytearray(READ_SIZE))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        # The reader copies it (StreamReader.feed_data takes any buffer; typeshed: bytes).
        self.data_received(self._read_buffer[:nbytes])  # type: ignore[arg-type]


async def open_connection(
    host: str, port: int, **options: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection(host, port, **options)``, reading into a reused buffer."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    protocol = _ReusedBufferProtocol(reader)
    transport, _ = await loop.create_connection(lambda: protocol, host, port, **options)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def start_server(
    connected: Connected, host: str, port: int, **options: Any
) -> asyncio.Server:
    """``asyncio.start_server(connected, host, port, **options)``, each connection
    reading into a reused buffer."""
    loop = asyncio.get_running_loop()

    def accepted() -> _ReusedBufferProtocol:
        return _ReusedBufferProtocol(asyncio.StreamReader(loop=loop), connected)

    return await loop.create_server(accepted, host, port, **options)
