"""Frames over an asyncio stream: reading one, and a writer that batches.

``FrameWriter`` owns the write side of a connection: callers queue encoded messages
(``send``), and its task drains everything queued by the time it runs into one frame
per turn of the event loop, so concurrent requests (or answers, or deliveries) share a
frame and a write. ``read_frame`` reads one frame body, refusing a length prefix above
the limit before reading the body.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Final, final

from walsvc.core._errors import CorruptRecord

from ._protocol import FRAME_HEADER, MAX_FRAME_BYTES, array_header

__all__ = ("FrameTooLarge", "FrameWriter", "read_frame")

_HEADER_SIZE: Final = FRAME_HEADER.size
#: Room for the frame's array header within ``MAX_FRAME_BYTES``.
_ARRAY_HEADER_ROOM: Final = 5


class FrameTooLarge(CorruptRecord):
    """A peer announced a frame longer than the limit."""


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes:
    """The body of the next frame; ``asyncio.IncompleteReadError`` at the end of the
    stream, ``FrameTooLarge`` for a length prefix above ``limit`` (the body is not
    read)."""
    header = await reader.readexactly(_HEADER_SIZE)
    (length,) = FRAME_HEADER.unpack(header)
    if length > limit:
        raise FrameTooLarge(f"a frame of {length} bytes exceeds the limit of {limit}")
    return await reader.readexactly(length)


#: Called once an item is in the transport (the peer may act on it from then on).
Sent = Callable[[], None]


@final
class FrameWriter:
    """The write side of a connection: queued messages leave in frames of as many as
    fit (``MAX_FRAME_BYTES``), one frame per loop turn. ``send`` never blocks; the caller
    bounds what it queues (requests wait for answers; streams have credit)."""

    __slots__ = ("_closed", "_closing", "_error", "_queue", "_task", "_wakeup", "_writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._queue: deque[tuple[bytes, Sent | None]] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._closing = False
        self._error: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def closed(self) -> bool:
        """True once the writer stopped (closed, or the connection failed)."""
        return self._closed

    def send(self, item: bytes, on_sent: Sent | None = None) -> None:
        """Queue one encoded message (``on_sent`` runs once it is in the transport).
        ``item`` must fit in a frame; items queued after close are dropped."""
        if self._closed:
            return
        self._queue.append((item, on_sent))
        self._wakeup.set()

    async def _run(self) -> None:
        queue, writer = self._queue, self._writer
        limit = MAX_FRAME_BYTES - _ARRAY_HEADER_ROOM
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while queue:
                    items: list[bytes] = []
                    callbacks: list[Sent] = []
                    size = 0
                    while queue and size + len(queue[0][0]) <= limit:
                        item, on_sent = queue.popleft()
                        items.append(item)
                        size += len(item)
                        if on_sent is not None:
                            callbacks.append(on_sent)
                    if not items:  # a caller broke the contract: drop the item, not the link
                        queue.popleft()
                        continue
                    head = array_header(len(items))
                    writer.write(FRAME_HEADER.pack(size + len(head)) + head + b"".join(items))
                    for on_sent in callbacks:
                        on_sent()
                    await writer.drain()
                if self._closing:
                    return
        except (ConnectionError, OSError) as exc:
            self._error = exc
        finally:
            self._closed = True
            queue.clear()

    def abort(self) -> None:
        """Drop the connection at once, unsent bytes and all (a peer gone silent)."""
        self._closed = True
        self._writer.transport.abort()

    async def aclose(self, flush_timeout: float = 5.0) -> None:
        """Send what is queued (for at most ``flush_timeout`` seconds, while the
        connection lasts), then close the connection. Idempotent."""
        self._closing = True
        self._wakeup.set()
        try:
            if not self._task.done():
                await asyncio.wait((self._task,), timeout=flush_timeout)
        finally:
            self._task.cancel()
            self._closed = True
            self._writer.close()
        await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
