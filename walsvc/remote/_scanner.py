"""The scanner of a walsvc node's stream: it buffers at most its window (messages and
payload bytes) and grants the node credit as the user consumes."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, final

import msgspec

from walsvc.core._api import Scanner, ScannerStats
from walsvc.core._errors import (
    InvalidArgument,
    WALClosed,
    WALError,
)
from walsvc.core._ids import MessageId
from walsvc.core._message import (
    ImmutableMessage,
)

from ._protocol import (
    Credit,
    Read,
    WireDelivered,
)

if TYPE_CHECKING:
    from ._client import RemoteWAL

__all__ = ("RemoteScanner", "not_served")


def not_served(what: str) -> InvalidArgument:
    return InvalidArgument(f"{what} is not served over walsvc:// yet (a later protocol version)")


def _cost(message: WireDelivered) -> int:
    """What a delivered message counts against a stream's byte credit (its payload's
    bytes; a TXN's: its body's too). The node counts the same."""
    cost = len(message.payload)
    for inner in message.body:
        cost += len(inner.payload)
    return cost


@final
class RemoteScanner(Scanner):
    """A scanner fed by a node over one stream (see ``RemoteWAL.read``). It holds at
    most its window (messages and payload bytes) of undelivered messages; the node waits
    for credit beyond that."""

    __slots__ = (
        "_buffer",
        "_delivered",
        "_end",
        "_owed_bytes",
        "_owed_messages",
        "_position",
        "_read",
        "_received",
        "_start_tick",
        "_stream",
        "_user_closed",
        "_waiter",
        "_wal",
        "_window_bytes",
        "_window_messages",
    )

    def __init__(self, wal: RemoteWAL, read: Read) -> None:
        self._wal = wal
        self._read = read
        self._stream = read.stream
        self._window_messages = read.credit_messages
        self._window_bytes = read.credit_bytes
        super().__init__()
        self._buffer: deque[list[WireDelivered]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: Why the stream ended: None while it runs; ``_ENDED`` for a normal end.
        self._end: WALError | object | None = None
        self._user_closed = False
        self._delivered = 0
        self._owed_messages = 0
        self._owed_bytes = 0
        self._position: MessageId | None = None
        #: The id of the last message received (delivered or buffered): a resumed
        #: stream starts after it.
        self._received: str | None = None
        #: A ``latest`` stream's starting timetick, once the node told it.
        self._start_tick: int | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _deliver(self, messages: list[WireDelivered]) -> None:
        if messages and self._end is None:
            self._buffer.append(messages)
            self._received = messages[-1].message_id
            self._wake()

    def _started(self, timetick: int) -> None:
        self._start_tick = timetick

    def _resume(self, handle: int) -> Read:
        """The ``Read`` that continues this stream on a new socket for the WAL handle
        ``handle``: right after the last message received (a ``latest`` stream that
        received none: after its starting timetick), with the credit the buffer leaves."""
        read = self._read
        if self._received is not None:
            deliver, deliver_id, after = "start_after", self._received, 0
        elif read.deliver == "latest" and self._start_tick is not None:
            deliver, deliver_id, after = "checkpoint", None, self._start_tick
        else:
            deliver, deliver_id, after = read.deliver, read.deliver_id, read.after_timetick
        buffered = sum(map(len, self._buffer))
        buffered_bytes = sum(_cost(m) for batch in self._buffer for m in batch)
        self._owed_messages = self._owed_bytes = 0
        return msgspec.structs.replace(
            read,
            wal=handle,
            deliver=deliver,
            deliver_id=deliver_id,
            after_timetick=after,
            credit_messages=max(0, self._window_messages - buffered),
            credit_bytes=max(0, self._window_bytes - buffered_bytes),
        )

    def _finish(self, error: WALError | None) -> None:
        if self._end is None:
            self._end = _ENDED if error is None else error
        self._wake()

    def _close_for_wal(self) -> None:
        """The WAL closed: nothing buffered is delivered; reads raise ``WALClosed``."""
        self._buffer.clear()
        self._batch, self._index = (), 0
        self._end = WALClosed("the WAL of this scanner is closed")
        self._wal._conn.forget_stream(self._stream)
        self._wake()

    async def _next_batch(self) -> Sequence[ImmutableMessage]:
        while not self._buffer:
            if self._user_closed:
                raise StopAsyncIteration
            end = self._end
            if end is _ENDED:
                raise StopAsyncIteration
            if isinstance(end, WALError):
                raise type(end)(str(end))  # a fresh error each time: no piled tracebacks
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._user_closed:
            raise StopAsyncIteration
        wire = self._buffer.popleft()
        to_message = self._wal._message
        batch = [to_message(m) for m in wire]
        self._grant(len(wire), sum(map(_cost, wire)))
        self._delivered += len(batch)
        self._position = batch[-1].message_id
        return batch

    def _grant(self, messages: int, cost: int) -> None:
        """Return the credit of what the user took, in steps of half a window."""
        self._owed_messages += messages
        self._owed_bytes += cost
        if (
            self._owed_messages * 2 >= self._window_messages
            or self._owed_bytes * 2 >= self._window_bytes
        ) and self._end is None:
            self._wal._conn.send(Credit(self._stream, self._owed_messages, self._owed_bytes))
            self._owed_messages = self._owed_bytes = 0

    async def ack(self, message: ImmutableMessage) -> None:
        """Not served over walsvc:// yet (no durable subscriptions): raises
        ``InvalidArgument``."""
        raise not_served("ack (durable subscriptions)")

    async def flush(self) -> None:
        """A scanner without a subscription has no checkpoint: nothing to write."""

    def stats(self) -> ScannerStats:
        """A snapshot of this scanner: what it delivered and its position (the node's
        stages are not reported yet)."""
        return ScannerStats(
            source="node",
            position=self._position,
            delivered=self._delivered,
            handoffs=0,
            fallbacks=0,
            rejected=0,
            held_for_order=0,
            open_txns=0,
            txn_bytes=0,
            checkpoint=None,
        )

    async def aclose(self) -> None:
        """Stop the scanner (iteration then ends) and the node's stream. Idempotent."""
        if self._user_closed:
            return
        self._user_closed = True
        self._batch, self._index = (), 0
        self._buffer.clear()
        self._wal._forget_scanner(self)
        self._wal._conn.forget_stream(self._stream)
        self._wake()


#: The end of a stream closed normally.
_ENDED: Final = object()
