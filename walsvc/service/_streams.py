"""A connection's streams, by number: opened by ``Read``, fed by their pumps (``_pump``),
granted ``Credit``, acknowledged (``_subscriptions``), flushed and closed.

``open`` checks the ``Read`` (the stream number free, the WAL handle, the delivery
policy), opens the WAL's scanner (the WAL filters by header; the tail cache serves
tailing readers) and starts its pump; what fails there ends the stream at once
(``StreamEnded`` with the error). A stream's scanner closes (its subscription's
checkpoint written, the name released) before ``CloseStream``, ``CloseWal`` or
``Flush(close)`` is answered. A stream whose scanner ended or failed is told so
(``StreamEnded`` with the error) if it is still listed then; those ``end_all`` stops
are told by it, or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final, final

import msgspec

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import InvalidArgument, WALError
from walsvc.core._filter import Filter
from walsvc.core._ids import unmarshal_message_id
from walsvc.remote._frames import FrameWriter
from walsvc.remote._protocol import (
    STREAM_STATS_VERSION,
    Ack,
    AckFailed,
    Credit,
    ErrorCode,
    Read,
    StreamEnded,
    StreamStarted,
    error_code,
)
from walsvc.wal._wal import LocalWAL

from ._limits import check_credit
from ._pump import Stream, pump
from ._stream_stats import StatsReporter
from ._subscriptions import acknowledge
from ._wire import encode

__all__ = ("Streams",)

_log: Final = logging.getLogger("walsvc.service")


@final
class Streams:
    """The streams of one connection (``writer`` its frames, ``peer`` its client as the
    log names it, ``version`` the protocol version negotiated), by stream number."""

    __slots__ = ("_peer", "_streams", "_version", "_writer")

    def __init__(self, writer: FrameWriter, peer: str, version: int) -> None:
        self._writer = writer
        self._peer = peer
        self._version = version
        self._streams: dict[int, Stream] = {}

    def _send(self, item: msgspec.Struct) -> None:
        self._writer.send(encode(item))

    def __contains__(self, number: int) -> bool:
        return number in self._streams

    def items(self) -> list[tuple[int, Stream]]:
        """The streams now, with their numbers."""
        return list(self._streams.items())

    def of_wal(self, handle: int) -> list[int]:
        """The numbers of the streams that read the WAL opened as ``handle``."""
        return [n for n, s in self._streams.items() if s.wal == handle]

    def open(self, request: Read, wal_of: Callable[[int], tuple[LocalWAL, bool]]) -> None:
        """Start the stream ``request`` asks for, reading the WAL ``wal_of`` its handle
        (which raises if there is none); or end it at once with what failed."""
        if request.stream in self._streams:
            self._send(StreamEnded(request.stream, ErrorCode.INVALID_ARGUMENT, "stream in use"))
            return
        try:
            wal = wal_of(request.wal)[0]
            position = (
                None if request.deliver_id is None else unmarshal_message_id(request.deliver_id)
            )
            deliver = DeliverPolicy(
                request.deliver,  # type: ignore[arg-type]
                position,
                request.after_timetick,
            )
            if deliver.kind not in ("all", "latest", "start_from", "start_after", "checkpoint"):
                raise InvalidArgument(f"unknown deliver policy {deliver.kind!r}")
            if deliver.kind in ("start_from", "start_after") and position is None:
                raise InvalidArgument(f"deliver policy {deliver.kind!r} needs a message id")
            selected = Filter(
                vchannels=request.vchannels,
                types=request.types,
                min_timetick=request.min_timetick,
            )
            scanner = wal.read(
                deliver,
                [selected],
                timeticks=request.timeticks,
                raw=request.raw,
                txn_buffer_bytes=request.txn_buffer_bytes,
                subscription=request.subscription,
                checkpoint_interval=request.checkpoint_interval,
            )
        except Exception as exc:
            self._send(StreamEnded(request.stream, error_code(exc), str(exc)))
            return
        stream = self._streams[request.stream] = Stream(request, scanner)
        if deliver.kind == "latest":
            self._send(StreamStarted(request.stream, wal.last_timetick))
        if self._version >= STREAM_STATS_VERSION:
            stream.report = StatsReporter(request.stream, scanner, self._writer)
            stream.report.report()
        stream.task = asyncio.get_running_loop().create_task(
            pump(request.stream, stream, scanner, self._writer, self._peer, self._ended)
        )

    def _ended(self, number: int, code: int, text: str) -> None:
        """The pump of stream ``number`` ended: tell the client, unless the stream was
        stopped meanwhile."""
        if self._streams.pop(number, None) is not None:
            self._send(StreamEnded(number, code, text))

    def credit(self, credit: Credit) -> None:
        """Grant a stream ``credit`` (none if it ended); raise ``CorruptRecord`` if its
        credit is now above the protocol's bound."""
        stream = self._streams.get(credit.stream)
        if stream is not None:
            stream.messages += credit.messages
            stream.bytes += credit.bytes
            check_credit(stream.messages, stream.bytes)
            stream.credit.set()

    def ack(self, ack: Ack) -> None:
        """Apply ``ack`` to its stream's scanner (nothing if the stream ended); what
        fails is sent back as ``AckFailed``."""
        stream = self._streams.get(ack.stream)
        if stream is None or stream.ending:
            return  # ended: the client learns it from StreamEnded
        try:
            acknowledge(stream.scanner, ack)
            if stream.report is not None:
                stream.report.acked(ack.checkpoint_tick)
        except Exception as exc:
            if not isinstance(exc, WALError):
                _log.exception("an ack of stream %d of %s failed", ack.stream, self._peer)
            self._send(AckFailed(ack.stream, error_code(exc), str(exc)))

    async def flush(self, number: int, close: bool) -> None:
        """Write the stream's checkpoint (``close``: stop the stream and close its
        scanner); raise what that raised. Nothing if there is no such stream. A stream
        that is ending (its read failed: acks are no longer applied) ends first, so
        its ``StreamEnded`` goes out ahead of the answer: the client then flushes again
        behind its latest ack on the stream it resumes."""
        stream = self._streams.get(number)
        if stream is not None and stream.ending and stream.task is not None:
            await asyncio.gather(stream.task, return_exceptions=True)
        elif close:
            await self._stop(number)
        elif stream is not None:
            await stream.scanner.flush()
            if stream.report is not None:
                stream.report.report()  # the checkpoint flushed, ahead of Done

    async def _stop(self, number: int) -> bool:
        """Stop the stream and close its scanner; raise what the close raised. The
        stream stays listed until its scanner closed, so a ``CloseWal`` meanwhile waits
        for it too. A pump that is ending on its own is not cancelled: it closes its
        scanner whole (the subscription's last checkpoint, its name released) and
        sends the stream's ``StreamEnded`` itself. Whether this call ended the stream
        (False: no such stream, or its pump ended it)."""
        stream = self._streams.get(number)
        if stream is None or stream.task is None:
            return False
        if not stream.ending:
            stream.task.cancel()
        await asyncio.gather(stream.task, return_exceptions=True)
        ended_here = self._streams.pop(number, None) is not None
        if stream.close_error is not None:
            raise stream.close_error
        return ended_here

    async def close(self, numbers: list[int]) -> None:
        """Stop each of the streams ``numbers`` and close its scanner, then tell the
        client ``StreamEnded`` (OK, whatever the close raised), unless its pump ended it
        meanwhile and said so."""
        # Returns once the streams' scanners closed: their subscriptions' checkpoints
        # are written and their names free for the next reader. One StreamEnded a
        # stream: not another after the one a pump that ended on its own sent.
        for number in numbers:
            ended_here = True
            with contextlib.suppress(Exception):
                ended_here = await self._stop(number)
            if ended_here:
                self._send(StreamEnded(number, ErrorCode.OK, ""))

    async def end_all(self, code: int | None = None, text: str = "") -> None:
        """Stop the streams (telling the client ``StreamEnded(code, text)`` unless
        ``code`` is None)."""
        streams, self._streams = self._streams, {}
        for number, stream in streams.items():
            stream.stop_reporting()  # nothing after its StreamEnded
            if stream.task is not None and not stream.ending:  # (see _stop)
                stream.task.cancel()
            if code is not None:
                self._send(StreamEnded(number, code, text))
        await asyncio.gather(
            *(s.task for s in streams.values() if s.task is not None), return_exceptions=True
        )
