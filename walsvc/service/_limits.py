"""What the node allows one peer (``NodeLimits``), enforced per connection.

- **Backpressure.** Everything the node sends a peer goes through its ``FrameWriter``,
  whose high water is ``send_queue_bytes``. Above it the node reads no more of the
  peer's requests (they wait in its socket, and then in the peer) and its streams send
  nothing, so what one peer queues is bounded by the high water plus the answers to
  the requests in flight plus one delivery per stream; other connections are not
  touched. ``Requests`` bounds those in flight (``max_in_flight``, and the bytes of
  messages they hold, ``max_in_flight_bytes``): beyond either the node reads no more
  requests until half of them were answered, so neither answers nor requests pile up
  while a backend is slow or a peer floods.
- **Timeouts.** One ``Watchdog`` per connection, waking every quarter of its shortest
  timeout, cuts off a peer that stays above the high water for ``stall_timeout``
  (it does not read), leaves a frame incomplete for ``frame_timeout`` (it trickles),
  or, with an ``idle_timeout``, sends nothing for that long. The peer's transport is
  aborted (its queue dropped) and the node logs one line.
- **Credit.** A stream's credit is bounded (``MAX_CREDIT`` in the protocol): a peer that
  grants more is breaking the protocol and is disconnected.
- **Dead peers.** TCP keepalive on every connection finds a peer whose host vanished.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable, Iterator
from typing import Any, Final, final

from walsvc.core._errors import CorruptRecord
from walsvc.remote._frames import FrameTooLarge, FrameWriter
from walsvc.remote._node_status import NodeLimits
from walsvc.remote._protocol import FRAME_HEADER, MAX_CREDIT, MAX_FRAME_BYTES

__all__ = ("STATUS_CHARGE", "Requests", "Watchdog", "check_credit", "keep_alive")

_HEADER_SIZE: Final = FRAME_HEADER.size
#: What a ``Status`` request counts against ``max_in_flight_bytes``: its answer grows
#: with the node's connections and streams, so few may wait at once.
STATUS_CHARGE: Final = 1 << 20
#: TCP keepalive: first probe after this many idle seconds, then every interval, and
#: the connection fails after this many unanswered probes (about 2 minutes in all).
_KEEPALIVE: Final = (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))


def keep_alive(sock: socket.socket | None) -> None:
    """Turn on TCP keepalive for an accepted connection (where the platform has it)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _KEEPALIVE:
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError:
        pass  # a connection already gone: its reads say so


def check_credit(messages: int, bytes_: int) -> None:
    """Raise ``CorruptRecord`` (a protocol error: the peer is disconnected) if a stream's
    credit is above ``MAX_CREDIT``."""
    if messages > MAX_CREDIT or bytes_ > MAX_CREDIT:
        raise CorruptRecord(
            f"a stream's credit of {messages} messages and {bytes_} bytes exceeds {MAX_CREDIT}"
        )


@final
class Requests:
    """The requests of one connection in flight: their futures (tasks, or the future of
    a group of appends; iterable), how many requests they answer (``len``), the bytes of
    messages they hold, and whether the node may read more (``room``)."""

    __slots__ = ("_count", "_high", "_high_bytes", "_room", "_tasks", "bytes")

    def __init__(self, limits: NodeLimits) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()
        self._count = 0
        self._high, self._high_bytes = limits.max_in_flight, limits.max_in_flight_bytes
        self._room = asyncio.Event()
        self._room.set()
        #: Bytes of messages held by the requests in flight (payloads plus 64 each).
        self.bytes = 0

    def add(self, task: asyncio.Future[Any], charge: int, requests: int = 1) -> None:
        """Count ``task`` in flight until it is done, as ``requests`` requests holding
        ``charge`` bytes."""
        self._tasks.add(task)
        self.bytes += charge
        self._count += requests
        task.add_done_callback(functools.partial(self._done, charge, requests))
        if self._count > self._high or self.bytes > self._high_bytes:
            self._room.clear()

    def _done(self, charge: int, requests: int, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        self.bytes -= charge
        self._count -= requests
        if (
            not self._room.is_set()
            and self._count <= self._high // 2
            and self.bytes <= self._high_bytes // 2
        ):
            self._room.set()

    @property
    def room(self) -> bool:
        """False from the moment a limit is exceeded until half of it is left."""
        return self._room.is_set()

    async def wait_room(self) -> None:
        """Return once ``room`` (at once if there is)."""
        await self._room.wait()

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[asyncio.Future[Any]]:
        return iter(list(self._tasks))


@final
class Watchdog:
    """The timeouts of one connection past its handshake, and its read side:
    ``read_frame`` waits for the peer to take what is queued for it, and for requests in
    flight to be answered, before it reads more of its requests. ``on_expiry(reason)``
    runs once when a timeout cuts the peer off (after its transport was aborted)."""

    __slots__ = (
        "_frames",
        "_handle",
        "_interval",
        "_limits",
        "_loop",
        "_on_expiry",
        "_requests",
        "frame_started",
        "last_frame",
    )

    def __init__(
        self,
        limits: NodeLimits,
        frames: FrameWriter,
        requests: Requests,
        on_expiry: Callable[[str], None],
    ) -> None:
        self._limits = limits
        self._frames = frames
        self._requests = requests
        self._on_expiry = on_expiry
        self._loop = loop = asyncio.get_running_loop()
        #: When the frame being read began (its length prefix arrived), or None.
        self.frame_started: float | None = None
        #: When the last frame began.
        self.last_frame = loop.time()
        timeouts = (limits.frame_timeout, limits.stall_timeout, limits.idle_timeout)
        self._interval = min(t for t in timeouts if t is not None) / 4
        self._handle = loop.call_later(self._interval, self._check)

    def _check(self) -> None:
        reason = self._expired(self._loop.time())
        if reason is None:
            self._handle = self._loop.call_later(self._interval, self._check)
            return
        self._frames.abort()
        self._on_expiry(reason)

    def _expired(self, now: float) -> str | None:
        limits, frames = self._limits, self._frames
        if frames.closed:
            return None
        started = self.frame_started
        if started is not None and now - started > limits.frame_timeout:
            return f"a frame stayed incomplete for {limits.frame_timeout:g} s"
        over = frames.over_since
        if over is not None and now - over > limits.stall_timeout:
            return (
                f"it took too little of the {frames.queued_bytes} bytes queued for it for"
                f" {limits.stall_timeout:g} s (limit {limits.send_queue_bytes} bytes)"
            )
        idle = limits.idle_timeout
        if (
            idle is not None
            and started is None
            and not self._requests  # a peer waiting for answers is not idle
            and self._frames.writable
            and now - self.last_frame > idle
        ):
            return f"it sent nothing for {idle:g} s"
        return None

    async def read_frame(self, reader: asyncio.StreamReader) -> bytes:
        """The body of the peer's next frame, read once the queue for the peer is below
        its high water; ``asyncio.IncompleteReadError`` at the end of the stream,
        ``ConnectionError`` once the watchdog cut the peer off, ``FrameTooLarge`` for a
        length prefix above the limit."""
        frames, requests = self._frames, self._requests
        while not (frames.writable and requests.room):
            await frames.wait_writable()
            if frames.closed:
                raise ConnectionAbortedError("the connection was cut off")
            await requests.wait_room()
        header = await reader.readexactly(_HEADER_SIZE)
        self.frame_started = self.last_frame = self._loop.time()
        (length,) = FRAME_HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise FrameTooLarge(f"a frame of {length} bytes exceeds the limit of {MAX_FRAME_BYTES}")
        body = await reader.readexactly(length)
        self.frame_started = None
        return body

    @property
    def reading(self) -> bool:
        """False while the node reads no more of the peer's requests (too much queued
        for it, or too many requests in flight)."""
        return self._frames.writable and self._requests.room

    def close(self) -> None:
        """Stop timing the connection."""
        self._handle.cancel()
