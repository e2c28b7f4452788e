"""The scanner of a walsvc node's stream: it buffers at most its window (messages and
payload bytes) and grants the node credit as the user consumes.

A scanner of a durable subscription sends each ``ack`` to the node's scanner of its
stream (``Ack``, no round trip: the node applies it in order with what follows, and a
failure comes back as ``AckFailed``, raised by the next ``ack``, ``flush`` or
``aclose``, as a local scanner raises a failed background checkpoint write);
``flush`` and ``aclose`` wait for the node's checkpoint write (``Flush``). A stream
resumed on a new socket sends the latest ack again once the node's scanner started (its
first batch, or, over protocol version 2, the ``StreamStats`` that says so): an ack lost
with its connection is not lost for the subscription. So is one lost with the
``aclose`` that followed it: the stream resumes on the next socket, the ack goes again
and then the close. One reader
per name: the node refuses a second one from any client (``SubscriptionBusy`` at the
first read); a second one in this process is refused at ``read``, as locally.

``stats()`` merges what the scanner knows itself (its position, what it delivered) with
the node scanner's stats, which a node that speaks protocol version 2 sends as
``StreamStats`` (at the start, at every source switch, within 100 ms of other changes;
see ``walsvc.service._stream_stats``): the latest one received counts. Over version 1
the source reads ``"node"`` and the node's figures are zeros. A stream resumed on a
new socket reads with a new node scanner: the counters of the earlier ones are added.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal, final

import msgspec

from walsvc.core._api import Scanner, ScannerStats
from walsvc.core._deliver import Checkpoint
from walsvc.core._errors import (
    BackendUnavailable,
    InvalidArgument,
    SubscriptionBusy,
    WALClosed,
    WALError,
)
from walsvc.core._ids import MessageId
from walsvc.core._message import (
    ImmutableMessage,
)

from ._protocol import (
    STREAM_STATS_VERSION,
    Ack,
    Credit,
    Flush,
    Read,
    StreamStats,
    WireDelivered,
)

if TYPE_CHECKING:
    from ._client import RemoteWAL

__all__ = ("RemoteScanner", "claim_subscription")

#: The subscriptions read by a scanner of this process: (node URL, pchannel, name).
_claimed: Final[set[tuple[str, str, str]]] = set()
#: The sources a node reports (any other reads as "node").
_SOURCES: Final[dict[str, Literal["cache", "backend", "not started"]]] = {
    "cache": "cache",
    "backend": "backend",
    "not started": "not started",
}


def claim_subscription(where: str, pchannel: str, name: str) -> tuple[str, str, str]:
    """Mark subscription ``name`` of ``pchannel`` on the node ``where`` as read in this
    process; raise ``SubscriptionBusy`` if a scanner of this process reads it."""
    key = (where, pchannel, name)
    if key in _claimed:
        raise SubscriptionBusy(
            f"subscription {name!r} is already being read by a scanner of this process"
        )
    _claimed.add(key)
    return key


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
        "_ack_error",
        "_ack_owed",
        "_ack_resent",
        "_buffer",
        "_claim",
        "_closing",
        "_delivered",
        "_end",
        "_last_ack",
        "_node_stats",
        "_owed_bytes",
        "_owed_messages",
        "_position",
        "_read",
        "_received",
        "_resumed",
        "_retried_at",
        "_retries",
        "_retry_since",
        "_skip_through",
        "_start_tick",
        "_started",
        "_stats_base",
        "_stream",
        "_subscription",
        "_suspended",
        "_suspensions",
        "_user_closed",
        "_waiter",
        "_wal",
        "_window_bytes",
        "_window_messages",
    )

    def __init__(
        self, wal: RemoteWAL, read: Read, claim: tuple[str, str, str] | None = None
    ) -> None:
        self._wal = wal
        self._read = read
        #: The subscription read (its claim in this process), or None.
        self._claim = claim
        self._subscription = None if claim is None else claim[2]
        #: True once a batch arrived: the node's scanner loaded its checkpoint.
        self._started = False
        #: A failed ``Ack`` the node reported, raised by the next ack, flush or aclose.
        self._ack_error: WALError | None = None
        #: The latest ``Ack`` sent, and whether to send it again: it may have been lost
        #: with its connection, so a resumed stream sends it once its first batch came
        #: (then the node's scanner has started and takes acks; it applies them forward
        #: only). A lost ack is for a message after the node's checkpoint, which the
        #: resumed stream delivers again: a batch always comes.
        self._last_ack: Ack | None = None
        self._ack_owed = False
        self._stream = read.stream
        self._window_messages = read.credit_messages
        self._window_bytes = read.credit_bytes
        super().__init__()
        #: Closing a subscription whose close was lost with its socket: the stream
        #: resumes on the next one anyway, to take the latest ack again (see ``aclose``).
        self._closing = False
        #: Set once a resumed stream's owed ack was sent, or the stream ended (one
        #: event for all who wait: ``_ack_resent_event``).
        self._ack_resent: asyncio.Event | None = None
        #: The node ended the stream and the client is to resume it (``goes_on``): until
        #: it does, the node has no stream to flush.
        self._suspended = False
        self._suspensions = 0  # times the node ended the stream and it went on
        self._buffer: deque[list[WireDelivered]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: Why the stream ended: None while it runs; ``_CLOSED`` for a normal end.
        self._end: WALError | object | None = None
        self._user_closed = False
        self._delivered = 0
        self._owed_messages = 0
        self._owed_bytes = 0
        self._position: MessageId | None = None
        #: The last message received (delivered or buffered): its id and its
        #: checkpoint (last-confirmed id, timetick); a resumed stream continues right
        #: after it (see ``_resume``).
        self._received: tuple[str, str | None, int] | None = None
        #: A ``latest`` stream's starting timetick, once the node told it.
        self._start_tick: int | None = None
        #: After a subscription stream resumed (from its checkpoint, on the node): the
        #: messages up to this id were received before and are dropped.
        self._skip_through: MessageId | None = None
        #: Resumed on a later socket (a subscription's name may still be held there).
        self._resumed = False
        #: Since when and how often the node ended the stream and its ``Read`` went out
        #: again (``read_again``), and when it last did: zero once it ran (``_ran``).
        self._retry_since = self._retried_at = 0.0
        self._retries = 0
        #: The latest stats of the node's scanner (protocol version 2), and what the
        #: node scanners of earlier sockets counted (a resumed stream's starts afresh).
        self._node_stats: StreamStats | None = None
        self._stats_base = _NO_STATS

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ran(self) -> None:
        """The stream ran again after the node ended it (it delivered, or stood for a
        while): a later end starts a new backoff."""
        self._retry_since = self._retried_at = 0.0
        self._retries = 0

    def _deliver(self, messages: list[WireDelivered]) -> None:
        if self._retries:
            self._ran()
        if self._ack_owed:  # the node's scanner of the resumed stream started: it takes acks
            self._send_owed_ack()
        if self._skip_through is not None:
            messages = self._unseen(messages)
        if messages and self._end is None and not self._user_closed:
            self._buffer.append(messages)
            last = messages[-1]
            tick = last.timetick if last.persisted else last.durable_tick
            self._received = (last.message_id, last.last_confirmed_id, tick)
            self._wake()

    def _suspend(self) -> None:
        """The node ended the stream and it goes on (``goes_on``): it is resumed later."""
        self._suspended = True
        self._suspensions += 1

    def _stats_arrived(self, stats: StreamStats) -> None:
        """The node's scanner's stats: the latest counts; once they say it started, it
        takes acks (a resumed stream with nothing to deliver sends no batch)."""
        self._node_stats = stats
        if self._ack_owed and stats.source != "not started":
            self._send_owed_ack()

    def _send_owed_ack(self) -> None:
        self._ack_owed = False
        assert self._last_ack is not None
        self._wal._conn.send(self._last_ack)
        self._set_ack_resent()

    def _ack_resent_event(self) -> asyncio.Event:
        """The event the next resent ack (or the stream's end) sets."""
        event = self._ack_resent
        if event is None:
            event = self._ack_resent = asyncio.Event()
        return event

    def _set_ack_resent(self) -> None:
        event, self._ack_resent = self._ack_resent, None
        if event is not None:
            event.set()

    def _unseen(self, messages: list[WireDelivered]) -> list[WireDelivered]:
        floor, ids = self._skip_through, self._wal._ids
        assert floor is not None
        fresh = [m for m in messages if ids(m.message_id) > floor]
        if fresh:
            self._skip_through = None
            if len(fresh) < len(messages):  # what was skipped returns its credit
                skipped = [m for m in messages if ids(m.message_id) <= floor]
                self._grant(len(skipped), sum(map(_cost, skipped)))
        else:
            self._grant(len(messages), sum(map(_cost, messages)))
        return fresh

    def _stream_started(self, timetick: int) -> None:
        self._start_tick = timetick

    def _resume(self, handle: int) -> Read:
        """The ``Read`` that continues this stream on a new socket for the WAL handle
        ``handle``: right after the last message received (a ``latest`` stream that
        received none: after its starting timetick), with the credit the buffer
        leaves. A subscription resumes from its checkpoint on the node, or where its
        first read started if it has none yet, dropping what was received before: read
        from after the last message received, a subscription with no checkpoint would
        start there, and its first idle tick would move the checkpoint past messages
        delivered and never acknowledged.

        Right after the last message is from its checkpoint, not just after its id: a
        transaction open at that message began before it, with bodies before it, and is
        delivered whole at its commit, later; read from the message's last-confirmed id
        (at or before every begin open there) and past its timetick, the resumed stream
        delivers it. A raw stream, which delivers each stored message, resumes just
        after the id. The latest ack is owed again from then on (see ``_deliver``)."""
        read = self._read
        self._resumed = True
        self._suspended = False
        last = self._node_stats
        if last is not None:
            base = self._stats_base
            self._stats_base = StreamStats(
                0,
                "",
                base.handoffs + last.handoffs,
                base.fallbacks + last.fallbacks,
                base.rejected + last.rejected,
                0,
                0,
                0,
                base.checkpoint if last.checkpoint is None else last.checkpoint,
            )
            self._node_stats = None
        deliver_id: str | None
        if self._received is not None and read.subscription is None:
            received, last_confirmed, tick = self._received
            if read.raw:
                deliver, deliver_id, after = "start_after", received, 0
            else:
                deliver, deliver_id, after = "checkpoint", last_confirmed, tick
        elif read.deliver == "latest" and self._start_tick is not None:
            deliver, deliver_id, after = "checkpoint", None, self._start_tick
        else:
            deliver, deliver_id, after = read.deliver, read.deliver_id, read.after_timetick
        if read.subscription is not None and self._received is not None:
            self._skip_through = self._wal._ids(self._received[0])
        buffered = sum(map(len, self._buffer))
        buffered_bytes = sum(_cost(m) for batch in self._buffer for m in batch)
        self._owed_messages = self._owed_bytes = 0
        self._ack_owed = self._last_ack is not None
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
        self._set_ack_resent()
        self._wake()

    def _ack_failed(self, error: WALError) -> None:
        if self._ack_error is None:
            self._ack_error = error

    def _raise_ack_error(self) -> None:
        error, self._ack_error = self._ack_error, None
        if error is not None:
            raise error

    def _release(self) -> None:
        if self._claim is not None:
            _claimed.discard(self._claim)
            self._claim = None

    def _close_for_wal(self) -> None:
        """The WAL closed: nothing buffered is delivered; reads raise ``WALClosed``. (The
        node closes the stream's scanner, writing its checkpoint, before it answers the
        WAL's ``CloseWal``.)"""
        self._buffer.clear()
        self._batch, self._index = (), 0
        self._end = WALClosed("the WAL of this scanner is closed")
        self._wal._conn.forget_stream(self._stream)
        self._release()
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
        batch = self._wal._messages(wire)
        self._grant(len(wire), sum(map(_cost, wire)))
        self._delivered += len(batch)
        self._position = batch[-1].message_id
        self._started = True
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
        """Acknowledge ``message`` (and everything delivered before it): the subscription
        resumes after it. The node records it (no round trip); its checkpoint writes are
        forward-only and throttled, and ``aclose`` flushes the last one. Raises
        ``InvalidArgument`` without a subscription or before this scanner delivered
        anything, ``WALClosed`` once it is closed or its stream ended, and the error of a
        failed earlier ack (a failed checkpoint write on the node)."""
        name = self._subscription
        if name is None:
            raise InvalidArgument("ack needs a scanner read with subscription='name'")
        if not isinstance(message, ImmutableMessage):
            raise TypeError(f"ack takes a delivered walsvc.ImmutableMessage, not {message!r}")
        if not self._started:
            raise InvalidArgument("ack of a message this scanner has not delivered yet")
        if self._user_closed or self._end is not None:
            raise WALClosed(f"the checkpoint writer of subscription {name!r} is closed")
        checkpoint = message.checkpoint
        lc = checkpoint.last_confirmed_id
        ack = self._last_ack = Ack(
            self._stream,
            message.timetick,
            None if lc is None else lc.marshal(),
            checkpoint.timetick,
        )
        self._wal._conn.send(ack)
        self._raise_ack_error()

    async def flush(self) -> None:
        """Write the subscription's latest acknowledged checkpoint now: returns once the
        node wrote it (nothing to write without a subscription, before the first
        delivery, or once closed). An ack lost with its connection is sent again to
        the resumed stream first; if the stream ends meanwhile with an error, that
        error is raised (the latest ack may not be durable)."""
        if self._subscription is None or not self._started or self._user_closed:
            return
        if self._end is None and not await self._flush_behind_latest_ack(close=False):
            end = self._end
            if isinstance(end, WALError):
                raise type(end)(str(end))
        self._raise_ack_error()

    def stats(self) -> ScannerStats:
        """A snapshot of this scanner: its position and what it delivered (to the user),
        and the node's scanner as its latest report says: where it reads, hand-offs and
        fallbacks, what its stages reject and hold, the subscription's durable
        checkpoint. Before the first report the source is ``"not started"``; from a
        node that speaks only protocol version 1 it is ``"node"``, with zeros."""
        base, node = self._stats_base, self._node_stats
        source: Literal["cache", "backend", "node", "not started"]
        if node is None:
            node = _NO_STATS
            source = "not started" if self._wal._conn.version >= STREAM_STATS_VERSION else "node"
        else:
            source = _SOURCES.get(node.source, "node")
        checkpoint = base.checkpoint if node.checkpoint is None else node.checkpoint
        return ScannerStats(
            source=source,
            position=self._position,
            delivered=self._delivered,
            handoffs=base.handoffs + node.handoffs,
            fallbacks=base.fallbacks + node.fallbacks,
            rejected=base.rejected + node.rejected,
            held_for_order=node.held_for_order,
            open_txns=node.open_txns,
            txn_bytes=node.txn_bytes,
            checkpoint=None if checkpoint is None else self._checkpoint(checkpoint),
        )

    def _checkpoint(self, wire: tuple[str | None, int]) -> Checkpoint:
        lc, timetick = wire
        return Checkpoint(None if lc is None else self._wal._ids(lc), timetick)

    async def aclose(self) -> None:
        """Stop the scanner (iteration then ends) and the node's stream; for a
        subscription, return once the node wrote its last checkpoint, the latest ack's,
        and released the name (raising what that write raised). If the socket is lost
        first, the stream resumes on the next one to send the ack and the close again;
        if the node cannot be reached again within ``reconnect_timeout``, it returns
        with the checkpoint the node last wrote (the next reader may get again what
        was acknowledged after it). Idempotent."""
        if self._user_closed:
            return
        self._user_closed = True
        self._batch, self._index = (), 0
        self._buffer.clear()
        self._wal._forget_scanner(self)
        self._wake()
        conn = self._wal._conn
        try:
            if self._subscription is not None:
                await self._close_subscription()
        finally:
            self._closing = False
            conn.forget_stream(self._stream)
            self._release()
        self._raise_ack_error()

    async def _close_subscription(self) -> None:
        """Close the stream on the node (``Flush(close)``) behind the latest ack; a
        close that cannot be sent is the end if there is no ack to lose (the node
        closes the stream with the socket, writing the checkpoint it knew)."""
        self._closing = self._last_ack is not None
        with contextlib.suppress(BackendUnavailable):
            await self._flush_behind_latest_ack(close=True)

    async def _flush_behind_latest_ack(self, *, close: bool) -> bool:
        """Send ``Flush(close)`` until the node answers it (True), each time behind the
        latest ack; False if the stream ended first. A resumed stream owes the node its
        latest ack until the node's scanner started, and a stream the node ended has no
        scanner there until it is resumed: the flush waits for the ack sent again. A
        flush lost with its socket, or with no socket to go on, may have followed an
        ack lost with it: the stream resumes on the next socket (a closing one too:
        ``_closing``), sends the ack again, and the flush goes again. Without an ack,
        or to a node of protocol version 1 (which may never say its scanner started:
        no ``StreamStats``), it is sent once and a lost one raises
        ``BackendUnavailable``. An answer that came after the node ended the stream
        does not count: the node had no stream to flush, and it dropped an ack that
        came after the end."""
        conn = self._wal._conn
        while self._end is None:
            resent = self._ack_resent_event()
            waits = self._last_ack is not None and conn.version >= STREAM_STATS_VERSION
            if not (waits and (self._ack_owed or self._suspended)):
                request = conn.next_id()
                suspensions = self._suspensions
                try:
                    # Not held for the next socket: there it would come ahead of the
                    # stream's resumed Read and flush nothing.
                    flush = Flush(request, self._stream, close)
                    await conn.request(flush, request, hold=False).future
                    if not waits or self._suspensions == suspensions:
                        return True
                except BackendUnavailable:
                    if not waits:
                        raise
            await resent.wait()
        return False


#: The end of a stream closed normally.
_ENDED: Final = object()
#: Nothing counted by a node scanner yet.
_NO_STATS: Final = StreamStats(0, "", 0, 0, 0, 0, 0, 0, None)
