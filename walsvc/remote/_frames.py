"""Frames over an asyncio stream: reading one, and a writer that batches.

``FrameWriter`` owns the write side of a connection: callers queue encoded messages
(``send``), and a callback it schedules (``call_soon``: after the callbacks ready now)
writes everything queued by then as one frame, so concurrent requests (or answers, or
deliveries) share a frame and a write. A burst does not wait for its end: once
``FRAME_ITEMS`` messages are queued they leave at once, so the peer starts on the first
of them while the rest are produced. (Appends through a node pipeline this way: many
producers' answers in several frames instead of one split the producers into cohorts,
one on the disk while another is on the wire; measured in the commit that added it.)
While the transport takes each frame at once (its buffer empty after the write: the
usual case) no task runs and no future is made; a frame the transport must buffer wakes
the writer's task, which waits for the transport to drain. The writer counts the bytes
queued and not yet taken by the peer; with a high water it reports when they exceed it
(callers then stop producing: the node stops reading that peer's requests) and since
when.
``read_frame`` reads one frame body, refusing a length prefix above the limit before
reading the body.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Final, final

from walsvc.core._errors import CorruptRecord

from ._protocol import FRAME_HEADER, MAX_FRAME_BYTES, array_header

__all__ = ("FRAME_ITEMS", "MAX_ITEM_BYTES", "FrameTooLarge", "FrameWriter", "read_frame")

_HEADER_SIZE: Final = FRAME_HEADER.size
#: Room for the frame's array header within ``MAX_FRAME_BYTES``.
_ARRAY_HEADER_ROOM: Final = 5
#: The most one encoded message may take: a frame less its array header (``send``
#: takes nothing larger).
MAX_ITEM_BYTES: Final = MAX_FRAME_BYTES - _ARRAY_HEADER_ROOM
#: Messages queued that make a frame leave at once, without waiting for the loop turn
#: (measured with 8 to 256 producers appending through a node: 16 gains little, 64 gains
#: only from 128 producers up, 32 gains from 64 up).
FRAME_ITEMS: Final = 32


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
    bounds what it queues (requests wait for answers; streams have credit; with a
    ``high_water``, producers wait for ``wait_writable`` while ``writable`` is false)."""

    __slots__ = (
        "_closed",
        "_closing",
        "_draining",
        "_error",
        "_flush_scheduled",
        "_high_water",
        "_loop",
        "_low_water",
        "_queue",
        "_queued",
        "_task",
        "_transport",
        "_unsettled",
        "_wakeup",
        "_writable",
        "_writer",
        "over_since",
    )

    def __init__(self, writer: asyncio.StreamWriter, high_water: int | None = None) -> None:
        self._writer = writer
        self._transport = writer.transport
        self._loop = asyncio.get_running_loop()
        self._queue: deque[tuple[bytes, Sent | None]] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._closing = False
        self._error: BaseException | None = None
        self._queued = 0
        self._unsettled = 0  # bytes written to the transport, not yet seen drained
        self._flush_scheduled = False  # _flush is due at the end of this loop turn
        self._draining = False  # the task waits for the transport to drain
        self._high_water = high_water
        self._low_water = -1 if high_water is None else high_water // 2
        self._writable = asyncio.Event()
        self._writable.set()
        #: The loop time at which the queue last rose above the high water (None while
        #: it is writable).
        self.over_since: float | None = None
        self._task = self._loop.create_task(self._run())

    @property
    def closed(self) -> bool:
        """True once the writer stopped (closed, or the connection failed)."""
        return self._closed

    @property
    def queued_bytes(self) -> int:
        """Bytes of messages queued or written and not yet taken by the peer (the frame
        in the transport counts until the transport's buffer drained)."""
        return self._queued

    @property
    def writable(self) -> bool:
        """False from the moment the queued bytes exceed the high water until they fall
        to half of it (always true without a high water, and once closed)."""
        return self._writable.is_set()

    async def wait_writable(self) -> None:
        """Return once ``writable`` (at once if it is)."""
        await self._writable.wait()

    def send(self, item: bytes, on_sent: Sent | None = None) -> None:
        """Queue one encoded message (``on_sent`` runs once it is in the transport).
        ``item`` must fit in a frame; items queued after close are dropped."""
        if self._closed:
            return
        self._queue.append((item, on_sent))
        self._queued_more(len(item))

    def send_many(self, items: list[bytes]) -> None:
        """``send`` each of ``items`` (no ``on_sent``), in order: one wake-up and one check
        of the high water for them all (a group's answers)."""
        if self._closed or not items:
            return
        self._queue.extend(zip(items, repeat(None)))
        self._queued_more(sum(map(len, items)))

    def _queued_more(self, size: int) -> None:
        """``size`` more bytes were queued: past the high water, no longer writable; write
        frames now while a frame's worth of items waits, and the rest at the end of the
        loop's turn (``_flush``)."""
        self._queued += size
        high = self._high_water
        if high is not None and self._queued > high and self.over_since is None:
            self._writable.clear()
            self.over_since = self._loop.time()
        while (
            len(self._queue) >= FRAME_ITEMS
            and not self._closing
            and not self._transport.is_closing()
        ):
            self._write_frame()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write what is queued; if the transport took it all, count it as taken, else
        wake the task to wait for the transport to drain. While the task waits it
        writes what comes meanwhile once the transport drained."""
        self._flush_scheduled = False
        if self._closed or self._closing or self._draining:
            return  # the task writes what is queued (and aclose flushes)
        transport = self._transport
        if transport.is_closing():
            self._wakeup.set()  # the task's drain raises the connection's error
            return
        while self._queue:
            self._write_frame()
        if transport.get_write_buffer_size() == 0:
            self._settled(self._unsettled)
        else:
            self._wakeup.set()

    def _settled(self, written: int) -> None:
        """``written`` bytes of the frames written were taken by the transport's peer."""
        self._unsettled -= written
        self._queued -= written
        if self.over_since is not None and self._queued <= self._low_water:
            self.over_since = None
            self._writable.set()

    def _write_frame(self) -> None:
        """Write one frame of the messages queued (as many as fit) to the transport;
        their bytes count as queued until ``_run`` sees the transport drained."""
        queue, writer = self._queue, self._writer
        items: list[bytes] = []
        callbacks: list[Sent] = []
        size = 0
        limit = MAX_ITEM_BYTES
        while queue and size + len(queue[0][0]) <= limit:
            item, on_sent = queue.popleft()
            items.append(item)
            size += len(item)
            if on_sent is not None:
                callbacks.append(on_sent)
        if not items:  # a caller broke the contract: drop the item, not the link
            self._queued -= len(queue.popleft()[0])
            return
        head = array_header(len(items))
        writer.write(FRAME_HEADER.pack(size + len(head)) + head + b"".join(items))
        self._unsettled += size
        for on_sent in callbacks:
            on_sent()

    async def _run(self) -> None:
        queue, writer = self._queue, self._writer
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while queue or self._unsettled:
                    if queue:
                        self._write_frame()
                    written = self._unsettled
                    self._draining = True
                    try:
                        await writer.drain()
                    finally:
                        self._draining = False
                    self._settled(written)
                if self._closing:
                    return
        except (ConnectionError, OSError) as exc:
            self._error = exc
        finally:
            self._stopped()
            queue.clear()

    def _stopped(self) -> None:
        self._closed = True
        self._queued = 0
        self.over_since = None
        self._writable.set()  # nobody waits for a writer that will never drain

    def abort(self) -> None:
        """Drop the connection at once, unsent bytes and all (a peer gone silent, or one
        that does not read): the queue and the transport's buffer are discarded."""
        self._stopped()
        self._task.cancel()
        self._writer.transport.abort()

    async def aclose(self, flush_timeout: float = 5.0) -> None:
        """Send what is queued (for at most ``flush_timeout`` seconds, while the
        connection lasts), then close the connection; a peer that does not take what
        is left within that time is cut off (``abort``). Idempotent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout
        self._closing = True
        self._wakeup.set()
        try:
            if not self._task.done():
                await asyncio.wait((self._task,), timeout=flush_timeout)
        finally:
            self._task.cancel()
            self._stopped()
            self._writer.close()
        await asyncio.gather(self._task, return_exceptions=True)
        try:
            # close() waits for the transport's buffer to go out: a peer that reads
            # nothing would hold the connection (and this call) forever.
            async with asyncio.timeout_at(max(deadline, loop.time() + 0.1)):
                await self._writer.wait_closed()
        except TimeoutError:
            self._writer.transport.abort()
        except (ConnectionError, OSError):
            pass
