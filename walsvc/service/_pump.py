"""A stream's pump: its scanner's batches sent to the client as ``Delivered``, within
the stream's credit and the connection's send queue.

A ``Delivered`` holds what the credit allows, in messages and in payload bytes (as the
client counts them: a message's payload plus its body's), and at most
``_DELIVERY_BYTES``. With no credit left the pump waits for a ``Credit``
(``Stream.credit``); while the connection's ``FrameWriter`` is above its high water (the
peer reads too little) it waits for the queue to drain, so a stalled reader holds its
window and no more. When the scanner's source switched, or it reads the backend, the
stream's stats reporter (``_stream_stats``, protocol version 2) is told ahead of the
messages. Whichever way the pump ends, the stream's reporter stops and its scanner is
closed (a subscription's last checkpoint written) before the pump says how the stream
ended (``ended``), or re-raises its cancellation (and says nothing).
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Final, final

from walsvc.core._errors import WALClosed, WALError
from walsvc.core._message import ImmutableMessage
from walsvc.read._scanner import LocalScanner
from walsvc.remote._frames import FrameWriter
from walsvc.remote._protocol import ErrorCode, Read, error_code

from ._stream_stats import StatsReporter
from ._subscriptions import close_scanner
from ._wire import encode_delivered

__all__ = ("Stream", "pump")

_log: Final = logging.getLogger("walsvc.service")
#: Largest payload bytes in one ``Delivered`` message (a frame holds several).
_DELIVERY_BYTES: Final = 1024 * 1024


_payload: Final = operator.attrgetter("payload")
_body: Final = operator.attrgetter("body")


def _cost(m: ImmutableMessage) -> int:
    """A message's cost against byte credit (as the client counts it)."""
    cost = len(m.payload)
    for inner in m.body:
        cost += len(inner.payload)
    return cost


def _take(
    batch: Sequence[ImmutableMessage], start: int, messages: int, credit_bytes: int
) -> tuple[int, int]:
    """(end, cost) of the next ``Delivered`` of ``batch`` from ``start``: messages while
    fewer than ``messages`` are taken and the cost so far is below ``credit_bytes`` and
    ``_DELIVERY_BYTES`` (the message that crosses it is taken too). The usual case, all
    the rest within the credit and without bodies, is summed in C loops (a Python loop
    cost 225 ns a message)."""
    limit = min(credit_bytes, _DELIVERY_BYTES)
    end = min(len(batch), start + messages)
    chunk = batch[start:end]
    spent = sum(map(len, map(_payload, chunk)))
    if spent < limit and not any(map(_body, chunk)):
        return end, spent
    end, spent = start, 0
    while end < len(batch) and end - start < messages and spent < limit:
        spent += _cost(batch[end])
        end += 1
    return end, spent


@final
class Stream:
    """One client stream: its scanner's pump and its credit; what closing the scanner
    raised (a subscription's last checkpoint write), once the pump was cancelled; the
    reporter of its scanner's stats (protocol version 2 and later)."""

    __slots__ = (
        "bytes",
        "close_error",
        "credit",
        "delivered",
        "ending",
        "messages",
        "read",
        "report",
        "scanner",
        "task",
        "waiting_for_credit",
        "waiting_for_send",
        "wal",
    )

    def __init__(self, read: Read, scanner: LocalScanner) -> None:
        self.read = read
        self.wal = read.wal
        self.scanner = scanner
        self.close_error: Exception | None = None
        #: The pump is done and closes the scanner: acks are no longer applied (a
        #: client that reads on sends its latest again to the stream it resumes).
        self.ending = False
        self.messages = read.credit_messages
        self.bytes = read.credit_bytes
        self.credit = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.delivered = 0  # messages sent
        self.waiting_for_credit = self.waiting_for_send = False
        self.report: StatsReporter | None = None

    def stop_reporting(self) -> None:
        """The stream ends: its reporter sends nothing more (no stats after StreamEnded)."""
        if self.report is not None:
            self.report.close()


async def pump(
    number: int,
    stream: Stream,
    scanner: LocalScanner,
    writer: FrameWriter,
    peer: str,
    ended: Callable[[int, int, str], None],
) -> None:
    """Send the scanner's batches within the stream's credit, on ``writer``, until the
    scanner ends or fails; then close it and call ``ended(number, code, text)`` (the
    error code and text: ``ErrorCode.OK`` if neither the scanner nor its close failed).
    ``peer`` names the client in the log line of an unexpected failure. (``ended`` and
    not a return value: the pump is the stream's task itself, so that resuming it goes
    through no other coroutine.)"""
    code, text = ErrorCode.OK, ""
    report = stream.report
    try:
        async for batch in scanner.batches():
            start = 0
            while start < len(batch):
                while stream.messages <= 0 or stream.bytes <= 0:
                    stream.credit.clear()
                    stream.waiting_for_credit = True
                    await stream.credit.wait()
                stream.waiting_for_credit = False
                if not writer.writable:  # the peer reads too little: bounded queue
                    stream.waiting_for_send = True
                    await writer.wait_writable()
                    stream.waiting_for_send = False
                    if writer.closed:
                        raise WALClosed("the connection closed")
                end, spent = _take(batch, start, stream.messages, stream.bytes)
                stream.messages -= end - start
                stream.bytes -= spent
                stream.delivered += end - start
                if report is not None and (
                    report.on_backend
                    or scanner.switches != report.switches
                    or scanner.stage_changes != report.stage_changes
                ):
                    report.delivering()  # a source switch at once, the rest within 100 ms
                chunk = batch[start:end]
                writer.send(encode_delivered(number, chunk if type(chunk) is list else list(chunk)))
                start = end
    except asyncio.CancelledError:
        stream.ending = True
        stream.stop_reporting()
        stream.close_error = await close_scanner(scanner)
        raise
    except Exception as exc:
        if not isinstance(exc, WALError):
            _log.exception("stream %d of %s failed", number, peer)
        code, text = error_code(exc), str(exc)
    stream.ending = True
    stream.stop_reporting()
    closed = await close_scanner(scanner)
    if closed is not None and code == ErrorCode.OK:
        code, text = error_code(closed), str(closed)
    ended(number, code, text)
