"""One client connection after its handshake: its requests, frame by frame, served and
answered in any order, by request id.

The appends of one frame to one WAL start together (``_appends``); streams are the
connection's ``Streams`` (``_streams``); the WALs it opened are its handles, each
read-write or read-only, into the node's one WAL of the pchannel. Transactions belong to
the node, not the connection (``_txns``): closing a connection aborts none. ``Status``
is answered from ``_status``; while the node drains, ``_drain`` answers what it no
longer serves. Every request that waits for the WAL counts against the connection's
requests in flight (``_limits``) until it is answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Final, final

import msgspec

from walsvc.core._errors import CorruptRecord, InvalidArgument, WALError, WALFenced, WALReadOnly
from walsvc.core._ids import unmarshal_message_id
from walsvc.remote._frames import FrameWriter
from walsvc.remote._protocol import (
    RECALL_VERSION,
    Ack,
    Append,
    AppendMany,
    ClientMessage,
    CloseStream,
    CloseWal,
    Credit,
    DeleteSubscription,
    Done,
    ErrorCode,
    Failed,
    Flush,
    LatestId,
    LatestIdIs,
    Opened,
    OpenWal,
    Ping,
    Pong,
    Read,
    Recall,
    Status,
    StreamEnded,
    Truncate,
    TxnAppend,
    TxnBegin,
    TxnCommit,
    TxnResume,
    TxnRollback,
    error_code,
)
from walsvc.wal._wal import LocalWAL

from ._appends import append_many, recall, start_group
from ._drain import draining_answer
from ._limits import STATUS_CHARGE, Requests, Watchdog
from ._status import answer_status
from ._streams import Streams
from ._txns import TxnRequest
from ._wire import charge_of, encode

if TYPE_CHECKING:
    from ._server import NodeServer

__all__ = ("Session",)

_log: Final = logging.getLogger("walsvc.service")
_TXN_REQUESTS: Final = (TxnBegin, TxnResume, TxnAppend, TxnCommit, TxnRollback)


@final
class Session:
    """One client connection after its handshake, on ``node``: ``writer`` its frames,
    ``peer`` and ``number`` name it, ``version`` is the protocol version negotiated.
    It holds the WALs it opened (``handles``: handle -> (WAL, read-only)), its
    ``streams`` and its requests ``in_flight``; ``draining`` once the node drains."""

    def __init__(
        self, node: NodeServer, writer: FrameWriter, peer: str, number: int, version: int
    ) -> None:
        self.node = node
        self.version = version  # the protocol version negotiated
        self.writer = writer
        self.peer = peer
        self.number = number
        self.connected_at = time.time()
        self.watchdog: Watchdog | None = None
        self.handles: dict[int, tuple[LocalWAL, bool]] = {}
        #: Handles a reconnect of their producer fenced, with why (``_fences``).
        self.fenced: dict[int, str] = {}
        #: The producers that opened a WAL through this connection (``_fences``).
        self.producers: set[str] = set()
        self._next_handle = 1
        self.streams = Streams(writer, peer, version)
        self.in_flight = Requests(node.limits)
        self.draining = False

    def send(self, item: msgspec.Struct) -> None:
        """Queue ``item`` for the client."""
        self.writer.send(encode(item))

    def send_encoded(self, item: bytes) -> None:
        """Queue ``item``, a message already encoded as ``encode`` does, for the client."""
        self.writer.send(item)

    def send_encoded_many(self, items: list[bytes]) -> None:
        """``send_encoded`` each of ``items``, in order, in one call."""
        self.writer.send_many(items)

    def _spawn(self, coroutine: Any, charge: int = 64) -> None:
        self.in_flight.add(asyncio.get_running_loop().create_task(coroutine), charge)

    def fail(self, request: int, error: BaseException) -> None:
        """Answer ``request`` with ``Failed`` (``error``'s code and text); an error that
        is not a ``WALError`` is the node's own, and logged."""
        if not isinstance(error, WALError):
            _log.exception("request %d of %s failed", request, self.peer, exc_info=error)
        self.send(Failed(request, error_code(error), str(error)))

    def handle_frame(self, messages: list[ClientMessage]) -> None:
        """``handle`` each message of a frame in order, except that runs of ``Append``
        to one WAL start together (``start_group``), as their producers did."""
        run: list[Append] = []
        for message in messages:
            if type(message) is Append and not self.draining:
                if run and run[0].wal != message.wal:
                    start_group(self, run)
                    run = []
                run.append(message)
                continue
            if run:
                start_group(self, run)
                run = []
            self.handle(message)
        if run:
            start_group(self, run)

    def handle(self, message: ClientMessage) -> None:
        """Serve ``message`` (while draining, answer what the node no longer serves as
        ``draining_answer`` says); raise ``CorruptRecord`` for one a client may not send
        after the handshake."""
        if self.draining and (answer := draining_answer(message)) is not None:
            self.send(answer)
        elif isinstance(message, Append):
            start_group(self, [message])
        elif isinstance(message, Credit):
            self.streams.credit(message)
        elif isinstance(message, AppendMany):
            self._spawn(append_many(self, message), charge_of(message.messages))
        elif isinstance(message, Read):
            self.streams.open(message, self._wal)
        elif isinstance(message, CloseStream):
            self._close_stream(message.stream)
        elif isinstance(message, LatestId):
            self._spawn(self._latest(message))
        elif isinstance(message, OpenWal):
            self._spawn(self._open(message))
        elif isinstance(message, Ping):
            self.send(Pong(message.nonce))
        elif isinstance(message, CloseWal):
            self.handles.pop(message.wal, None)
            self._spawn(self._close_wal(message.request, self.streams.of_wal(message.wal)))
        elif isinstance(message, _TXN_REQUESTS):
            self._spawn(self._txn(message))
        elif isinstance(message, Ack):
            self.streams.ack(message)
        elif isinstance(message, Flush):
            self._spawn(self._flush(message))
        elif isinstance(message, Truncate | DeleteSubscription):
            self._spawn(self._admin(message))
        elif isinstance(message, Recall):
            self._spawn(recall(self, message), 64 + 32 * len(message.keys))
        elif isinstance(message, Status):
            self._spawn(answer_status(self, message), STATUS_CHARGE)
        else:
            raise CorruptRecord(f"{type(message).__name__} after the handshake")

    def writable(self, handle: int) -> LocalWAL:
        """The WAL opened as ``handle``; raise if there is none or it is read-only."""
        wal, read_only = self._wal(handle)
        if read_only:
            raise WALReadOnly(f"WAL {wal.pchannel!r} was opened read-only")
        return wal

    def _wal(self, handle: int) -> tuple[LocalWAL, bool]:
        found = self.handles.get(handle)
        if found is None:
            if handle in self.fenced:
                raise WALFenced(self.fenced[handle])
            raise InvalidArgument(f"no WAL is open with handle {handle} on this connection")
        return found

    def fence(self, handle: int, reason: str) -> None:
        """Refuse every later request on ``handle`` with ``WALFenced`` (``reason``): its
        producer opened the WAL again on another connection. Its streams go on."""
        if self.handles.pop(handle, None) is not None:
            self.fenced[handle] = reason

    async def _open(self, request: OpenWal) -> None:
        try:
            wal = await self.node.wal(request.pchannel)
        except Exception as exc:
            self.fail(request.request, exc)
            return
        handle = self._next_handle
        self._next_handle += 1
        if request.producer is not None and not request.read_only:
            try:
                self.node.producers.claim(request.producer, request.epoch, self, handle)
            except WALFenced as exc:
                self.fail(request.request, exc)
                return
        self.handles[handle] = (wal, request.read_only)
        scheme = wal.backend.message_id_class.scheme  # the URL's, unless its ids are another's
        tick = wal.last_timetick if self.version >= RECALL_VERSION else 0  # 0: not said
        self.send(Opened(request.request, handle, wal.term, request.read_only, scheme, tick))

    async def _latest(self, request: LatestId) -> None:
        try:
            latest = await self._wal(request.wal)[0].latest_message_id()
        except Exception as exc:
            self.fail(request.request, exc)
            return
        self.send(LatestIdIs(request.request, None if latest is None else latest.marshal()))

    async def _txn(self, request: TxnRequest) -> None:
        try:
            answer = await self.node.txns.answer(self.writable(request.wal), request)
        except Exception as exc:
            self.fail(request.request, exc)
            return
        self.send(answer)

    async def _flush(self, request: Flush) -> None:
        try:
            await self.streams.flush(request.stream, request.close)
        except Exception as exc:
            self.fail(request.request, exc)
            return
        self.send(Done(request.request))

    def _close_stream(self, number: int) -> None:
        if number not in self.streams:
            self.send(StreamEnded(number, ErrorCode.OK, ""))
        else:
            self._spawn(self.streams.close([number]))

    async def _close_wal(self, request: int, streams: list[int]) -> None:
        # Answered once the streams' scanners closed: their subscriptions' checkpoints
        # are written and their names free for the next reader.
        await self.streams.close(streams)
        self.send(Done(request))

    async def _admin(self, request: Truncate | DeleteSubscription) -> None:
        try:
            if isinstance(request, Truncate):
                wal = self.writable(request.wal)
                await wal.truncate(unmarshal_message_id(request.message_id))
            else:
                await self._wal(request.wal)[0].delete_subscription(request.name)
        except Exception as exc:
            self.fail(request.request, exc)
            return
        self.send(Done(request.request))

    async def aclose(self) -> None:
        """Stop the streams; appends in flight finish (their answers go nowhere)."""
        self.node.producers.release(self)
        await self.streams.end_all()
        self.handles.clear()
