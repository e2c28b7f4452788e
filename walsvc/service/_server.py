"""The walsvc node: one backend's pchannels served to many client processes.

The node is each pchannel's single writer: it opens one WAL per pchannel on first use
(through its interceptor chain, so it is the one timetick authority) and keeps it for
all its clients. A connection is a session: the handshake first (versions, token),
then requests answered in any order (the appends of one frame start together as
independent appends, ``LocalWAL.submit_group``, and coalesce in the WAL with no task of
their own) and streams fed from the WAL's scanners (the WAL filters
by header; the tail cache serves tailing readers) within each stream's credit.
Transactions belong to the node, not the connection (``_txns``): closing a connection
aborts none. A stream's scanner closes (its subscription's checkpoint written, the name
released) before ``CloseStream``, ``CloseWal`` or ``Flush(close)`` is answered. A peer
that breaks the protocol (garbage, a length prefix above the limit) or the node's limits
(``_limits``: it does not read, it trickles) is disconnected alone, with one log line.
``Status`` is answered from ``_status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any, Final, cast, final

import msgspec

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import CorruptRecord, InvalidArgument, WALClosed, WALError, WALReadOnly
from walsvc.core._filter import Filter
from walsvc.core._ids import unmarshal_message_id
from walsvc.core._message import AppendResult, ImmutableMessage, Message
from walsvc.core._timetick import HybridClock
from walsvc.read._scanner import LocalScanner
from walsvc.remote._frames import FrameWriter, read_frame
from walsvc.remote._node_status import NodeLimits, NodeStatus
from walsvc.remote._protocol import (
    NODE_VERSIONS,
    PRODUCER_KEY_PREFIX,
    STREAM_STATS_VERSION,
    Ack,
    AckFailed,
    Append,
    Appended,
    AppendMany,
    ClientMessage,
    CloseStream,
    CloseWal,
    Credit,
    DeleteSubscription,
    Delivered,
    Done,
    ErrorCode,
    Failed,
    Flush,
    Hello,
    LatestId,
    LatestIdIs,
    Opened,
    OpenWal,
    Ping,
    Pong,
    Read,
    Refused,
    Status,
    StreamEnded,
    StreamStarted,
    Truncate,
    TxnAppend,
    TxnBegin,
    TxnCommit,
    TxnResume,
    TxnRollback,
    Welcome,
    WireDelivered,
    error_code,
    negotiate,
)
from walsvc.wal._open import open_wal
from walsvc.wal._wal import LocalWAL
from walsvc.write._coalesce import Outcome

from ._drain import DRAINING, drain_node, draining_answer
from ._limits import STATUS_CHARGE, Requests, Watchdog, check_credit, keep_alive
from ._status import answer_status, host_port, node_status
from ._stream_stats import StatsReporter
from ._subscriptions import acknowledge, close_scanner
from ._txns import NodeTxns, TxnRequest
from ._wire import message_of, wire_result

__all__ = ("NodeServer", "serve")

_log: Final = logging.getLogger("walsvc.service")
_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(list[ClientMessage]).decode
#: Largest payload bytes in one ``Delivered`` message (a frame holds several).
_DELIVERY_BYTES: Final = 1024 * 1024
_TXN_REQUESTS: Final = (TxnBegin, TxnResume, TxnAppend, TxnCommit, TxnRollback)


def _wire_delivered(m: ImmutableMessage) -> WireDelivered:
    """A delivered message as it crosses the wire (the per-message work of every stream:
    kept to what must change: ids to text, a producer key dropped)."""
    lc = m.last_confirmed_id
    if lc is None:
        lc_text = None
    elif lc == _last_lc[0]:  # consecutive messages mostly share their last-confirmed id
        lc_text = _last_lc[1]
    else:
        lc_text = lc.marshal()
        _last_lc[:] = (lc, lc_text)
    txn = m.txn
    key = m.idempotency_key
    if key is not None and key.startswith(PRODUCER_KEY_PREFIX):
        key = None  # a client's producer key: the appender gave the message none
    properties = m.properties
    return WireDelivered(
        m.message_id.marshal(),
        m.timetick,
        m.vchannel,
        m.type,  # an IntEnum: msgpack encodes its value
        m.payload,
        properties if type(properties) is dict else dict(properties),
        lc_text,
        None if txn is None else (txn.txn_id, txn.keepalive_ms),
        key,
        m.term,
        m.persisted,
        m.durable_tick,
        [_wire_delivered(inner) for inner in m.body] if m.body else [],
    )


#: The last last-confirmed id marshalled, and its text.
_last_lc: list[Any] = [None, None]


def _cost(m: ImmutableMessage) -> int:
    """A message's cost against byte credit (as the client counts it)."""
    cost = len(m.payload)
    for inner in m.body:
        cost += len(inner.payload)
    return cost


@final
class _Stream:
    """One client stream: its scanner's pump and its credit; what closing the scanner
    raised (a subscription's last checkpoint write), once the pump was cancelled; the
    reporter of its scanner's stats (protocol version 2 and later)."""

    __slots__ = (
        "bytes",
        "close_error",
        "credit",
        "delivered",
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


@final
class _Session:
    """One client connection after its handshake."""

    def __init__(
        self, node: NodeServer, writer: FrameWriter, peer: str, number: int, version: int
    ) -> None:
        self._node = node
        self.version = version  # the protocol version negotiated
        self._writer = writer
        self.peer = peer
        self.number = number
        self.connected_at = time.time()
        self.watchdog: Watchdog | None = None
        self._handles: dict[int, tuple[LocalWAL, bool]] = {}
        self._next_handle = 1
        self._streams: dict[int, _Stream] = {}
        self._tasks = Requests(node.limits)
        self.draining = False

    def _send(self, item: msgspec.Struct) -> None:
        self._writer.send(_encode(item))

    def _spawn(self, coroutine: Any, charge: int = 64) -> None:
        self._tasks.add(asyncio.get_running_loop().create_task(coroutine), charge)

    def _fail(self, request: int, error: BaseException) -> None:
        if not isinstance(error, WALError):
            _log.exception("request %d of %s failed", request, self.peer, exc_info=error)
        self._send(Failed(request, error_code(error), str(error)))

    def handle(self, message: ClientMessage) -> None:
        if self.draining and (answer := draining_answer(message)) is not None:
            self._send(answer)
        elif isinstance(message, Append):
            self._append_group([message])
        elif isinstance(message, Credit):
            stream = self._streams.get(message.stream)
            if stream is not None:
                stream.messages += message.messages
                stream.bytes += message.bytes
                check_credit(stream.messages, stream.bytes)
                stream.credit.set()
        elif isinstance(message, AppendMany):
            charge = sum(64 + len(m.payload) for m in message.messages)
            self._spawn(self._append_many(message), charge)
        elif isinstance(message, Read):
            self._read(message)
        elif isinstance(message, CloseStream):
            self._close_stream(message.stream)
        elif isinstance(message, LatestId):
            self._spawn(self._latest(message))
        elif isinstance(message, OpenWal):
            self._spawn(self._open(message))
        elif isinstance(message, Ping):
            self._send(Pong(message.nonce))
        elif isinstance(message, CloseWal):
            self._handles.pop(message.wal, None)
            closing = [n for n, s in self._streams.items() if s.wal == message.wal]
            self._spawn(self._close_wal(message.request, closing))
        elif isinstance(message, _TXN_REQUESTS):
            self._spawn(self._txn(message))
        elif isinstance(message, Ack):
            self._ack(message)
        elif isinstance(message, Flush):
            self._spawn(self._flush(message))
        elif isinstance(message, Truncate | DeleteSubscription):
            self._spawn(self._admin(message))
        elif isinstance(message, Status):
            self._spawn(answer_status(self, message), STATUS_CHARGE)
        else:
            raise CorruptRecord(f"{type(message).__name__} after the handshake")

    def _writable(self, handle: int) -> LocalWAL:
        wal, read_only = self._wal(handle)
        if read_only:
            raise WALReadOnly(f"WAL {wal.pchannel!r} was opened read-only")
        return wal

    def _wal(self, handle: int) -> tuple[LocalWAL, bool]:
        found = self._handles.get(handle)
        if found is None:
            raise InvalidArgument(f"no WAL is open with handle {handle} on this connection")
        return found

    async def _open(self, request: OpenWal) -> None:
        try:
            wal = await self._node.wal(request.pchannel)
        except Exception as exc:
            self._fail(request.request, exc)
            return
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = (wal, request.read_only)
        scheme = self._node.url.partition("://")[0]
        self._send(Opened(request.request, handle, wal.term, request.read_only, scheme))

    def handle_frame(self, messages: list[ClientMessage]) -> None:
        """``handle`` each message of a frame in order, except that runs of ``Append``
        to one WAL start together (``_append_group``), as their producers did."""
        run: list[Append] = []
        for message in messages:
            if type(message) is Append and not self.draining:
                if run and run[0].wal != message.wal:
                    self._append_group(run)
                    run = []
                run.append(message)
                continue
            if run:
                self._append_group(run)
                run = []
            self.handle(message)
        if run:
            self._append_group(run)

    def _append_group(self, requests: list[Append]) -> None:
        """Start the appends of ``requests`` (to one WAL) as independent appends, with
        no task: the WAL's future for the group answers each from its callback."""
        try:
            wal = self._writable(requests[0].wal)
        except Exception as exc:
            for request in requests:
                self._fail(request.request, exc)
            return
        messages: list[Message] = []
        started: list[int] = []
        charge = 0
        for request in requests:
            try:
                messages.append(message_of(request.message))
            except Exception as exc:  # an invalid message fails alone
                self._fail(request.request, exc)
                continue
            started.append(request.request)
            charge += 64 + len(request.message.payload)
        if not messages:
            return
        appended = wal.submit_group(messages)
        self._tasks.add(appended, charge, len(started))
        appended.add_done_callback(functools.partial(self._appended, started))

    def _appended(self, requests: list[int], appended: asyncio.Future[list[Outcome]]) -> None:
        if appended.cancelled():
            return  # the connection closed before its batch started: not in the log
        error = appended.exception()
        if error is not None:
            for request in requests:
                self._fail(request, error)
            return
        send, fail = self._send, self._fail
        for request, outcome in zip(requests, appended.result(), strict=True):
            if type(outcome) is AppendResult:
                send(Appended(request, [wire_result(outcome)]))
            else:
                fail(request, cast(Exception, outcome))

    async def _append_many(self, request: AppendMany) -> None:
        try:
            wal = self._writable(request.wal)
            results = await wal.append_many([message_of(m) for m in request.messages])
        except Exception as exc:
            self._fail(request.request, exc)
            return
        self._send(Appended(request.request, [wire_result(r) for r in results]))

    async def _latest(self, request: LatestId) -> None:
        try:
            latest = await self._wal(request.wal)[0].latest_message_id()
        except Exception as exc:
            self._fail(request.request, exc)
            return
        self._send(LatestIdIs(request.request, None if latest is None else latest.marshal()))

    async def _txn(self, request: TxnRequest) -> None:
        try:
            answer = await self._node.txns.answer(self._writable(request.wal), request)
        except Exception as exc:
            self._fail(request.request, exc)
            return
        self._send(answer)

    def _ack(self, ack: Ack) -> None:
        stream = self._streams.get(ack.stream)
        if stream is None:
            return  # ended: the client learns it from StreamEnded
        try:
            acknowledge(stream.scanner, ack)
            if stream.report is not None:
                stream.report.acked(ack.checkpoint_tick)
        except Exception as exc:
            if not isinstance(exc, WALError):
                _log.exception("an ack of stream %d of %s failed", ack.stream, self.peer)
            self._send(AckFailed(ack.stream, error_code(exc), str(exc)))

    async def _flush(self, request: Flush) -> None:
        try:
            if request.close:
                await self._end_stream(request.stream)
            else:
                stream = self._streams.get(request.stream)
                if stream is not None:
                    await stream.scanner.flush()
                    if stream.report is not None:
                        stream.report.report()  # the checkpoint flushed, ahead of Done
        except Exception as exc:
            self._fail(request.request, exc)
            return
        self._send(Done(request.request))

    async def _end_stream(self, number: int) -> None:
        """Stop the stream and close its scanner; raise what the close raised. The
        stream stays listed until its scanner closed, so a ``CloseWal`` meanwhile waits
        for it too."""
        stream = self._streams.get(number)
        if stream is None or stream.task is None:
            return
        stream.task.cancel()
        await asyncio.gather(stream.task, return_exceptions=True)
        self._streams.pop(number, None)
        if stream.close_error is not None:
            raise stream.close_error

    async def _close_wal(self, request: int | None, streams: list[int]) -> None:
        # Answered once the streams' scanners closed: their subscriptions' checkpoints
        # are written and their names free for the next reader.
        for number in streams:
            with contextlib.suppress(Exception):
                await self._end_stream(number)
            self._send(StreamEnded(number, ErrorCode.OK, ""))
        if request is not None:
            self._send(Done(request))

    async def _admin(self, request: Truncate | DeleteSubscription) -> None:
        try:
            if isinstance(request, Truncate):
                wal = self._writable(request.wal)
                await wal.truncate(unmarshal_message_id(request.message_id))
            else:
                await self._wal(request.wal)[0].delete_subscription(request.name)
        except Exception as exc:
            self._fail(request.request, exc)
            return
        self._send(Done(request.request))

    def _read(self, request: Read) -> None:
        if request.stream in self._streams:
            self._send(StreamEnded(request.stream, ErrorCode.INVALID_ARGUMENT, "stream in use"))
            return
        try:
            wal = self._wal(request.wal)[0]
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
        stream = self._streams[request.stream] = _Stream(request, scanner)
        if deliver.kind == "latest":
            self._send(StreamStarted(request.stream, wal.last_timetick))
        if self.version >= STREAM_STATS_VERSION:
            stream.report = StatsReporter(request.stream, scanner, self._writer)
            stream.report.report()
        stream.task = asyncio.get_running_loop().create_task(
            self._pump(request.stream, stream, scanner)
        )

    async def _pump(self, number: int, stream: _Stream, scanner: LocalScanner) -> None:
        """Send the scanner's batches within the stream's credit."""
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
                    writer = self._writer
                    if not writer.writable:  # the peer reads too little: bounded queue
                        stream.waiting_for_send = True
                        await writer.wait_writable()
                        stream.waiting_for_send = False
                        if writer.closed:
                            raise WALClosed("the connection closed")
                    end, spent = start, 0
                    limit = min(stream.bytes, _DELIVERY_BYTES)
                    while end < len(batch) and end - start < stream.messages and spent < limit:
                        spent += _cost(batch[end])
                        end += 1
                    stream.messages -= end - start
                    stream.bytes -= spent
                    stream.delivered += end - start
                    if report is not None and (
                        report.on_backend
                        or scanner.switches != report.switches
                        or scanner.stage_changes != report.stage_changes
                    ):
                        report.delivering()  # a source switch at once, the rest within 100 ms
                    self._send(Delivered(number, [_wire_delivered(m) for m in batch[start:end]]))
                    start = end
        except asyncio.CancelledError:
            stream.stop_reporting()
            stream.close_error = await close_scanner(scanner)
            raise
        except Exception as exc:
            if not isinstance(exc, WALError):
                _log.exception("stream %d of %s failed", number, self.peer)
            code, text = error_code(exc), str(exc)
        stream.stop_reporting()
        closed = await close_scanner(scanner)
        if closed is not None and code == ErrorCode.OK:
            code, text = error_code(closed), str(closed)
        if self._streams.pop(number, None) is not None:
            self._send(StreamEnded(number, code, text))

    def _close_stream(self, number: int) -> None:
        if number not in self._streams:
            self._send(StreamEnded(number, ErrorCode.OK, ""))
        else:
            self._spawn(self._close_wal(None, [number]))

    async def end_streams(self, code: int | None = None, text: str = "") -> None:
        """Stop the streams (telling the client ``StreamEnded(code, text)`` unless
        ``code`` is None)."""
        streams, self._streams = self._streams, {}
        for number, stream in streams.items():
            stream.stop_reporting()  # nothing after its StreamEnded
            if stream.task is not None:
                stream.task.cancel()
            if code is not None:
                self._send(StreamEnded(number, code, text))
        await asyncio.gather(
            *(s.task for s in streams.values() if s.task is not None), return_exceptions=True
        )

    async def aclose(self) -> None:
        """Stop the streams; appends in flight finish (their answers go nowhere)."""
        await self.end_streams()
        self._handles.clear()


@final
class NodeServer:
    """A running node (``walsvc.serve``): ``url`` is the ``walsvc://host:port`` clients
    open, ``address`` the (host, port) it listens on."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        wal_options: dict[str, Any],
        tls: ssl.SSLContext | None = None,
        limits: NodeLimits | None = None,
    ) -> None:
        self.url = url
        #: What the node allows each peer (timeouts, bytes queued).
        self.limits = NodeLimits() if limits is None else limits
        self._token = token
        self._tls = tls
        # One timetick authority for all the node's pchannels (as open_node has).
        self._wal_options = {"timetick_allocator": HybridClock(), **wal_options}
        self._wals: dict[str, LocalWAL] = {}
        #: The node's transactions, whichever connection began them.
        self.txns = NodeTxns()
        self._opening: dict[str, asyncio.Task[LocalWAL]] = {}
        self._server: asyncio.Server | None = None
        self._address = ("", 0)
        self._sessions: set[asyncio.Task[None]] = set()
        self._live: set[_Session] = set()  # the connections past their handshake
        self._connections = 0
        #: Peers disconnected for breaking the protocol (for tests and monitoring).
        self.refused_peers = 0
        #: True once the node drains (``GoingAway`` sent to every client).
        self.draining = False
        self._drained: asyncio.Task[None] | None = None
        #: When the node started listening (Unix time).
        self.started_at = time.time()
        self._started = time.monotonic()

    @property
    def address(self) -> tuple[str, int]:
        """The host and port the node listens on."""
        return self._address

    async def status(self) -> NodeStatus:
        """The node's status now (a ``NodeStatus``: what ``walsvc status`` shows)."""
        return await node_status(self)

    @property
    def node_url(self) -> str:
        """The URL clients open: ``walsvc://host:port``."""
        host, port = self.address
        return f"walsvc://{host}:{port}"

    async def wal(self, pchannel: str) -> LocalWAL:
        """The node's WAL of ``pchannel``, opened (read-write) on first use."""
        wal = self._wals.get(pchannel)
        if wal is not None:
            return wal
        opening = self._opening.get(pchannel)
        if opening is None:
            opening = asyncio.get_running_loop().create_task(
                open_wal(self.url, pchannel, **self._wal_options)
            )
            self._opening[pchannel] = opening
        try:
            wal = await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening.pop(pchannel, None)
        self._wals[pchannel] = wal
        return wal

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (port 0: any free port)."""
        self._server = await asyncio.start_server(
            self._accept,
            host,
            port,
            ssl=self._tls,
            ssl_handshake_timeout=self.limits.handshake_timeout if self._tls is not None else None,
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        self._address = (str(host), int(port))
        self.started_at, self._started = time.time(), time.monotonic()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions.add(task)
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            pass  # the node is closing: the connection ends quietly
        finally:
            self._sessions.discard(task)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = host_port(writer.get_extra_info("peername"))
        keep_alive(writer.get_extra_info("socket"))
        limits = self.limits
        try:
            async with asyncio.timeout(limits.handshake_timeout):
                hello = _decode(await read_frame(reader))
            if len(hello) != 1 or not isinstance(hello[0], Hello):
                raise CorruptRecord("the first frame must be one Hello")
        except TimeoutError:
            self._refuse_peer(peer, f"no Hello within {limits.handshake_timeout:g} s")
            writer.transport.abort()
            return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        except (CorruptRecord, msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._refuse_peer(peer, exc)
            writer.close()
            return
        refusal = self._check_hello(hello[0])
        frames = FrameWriter(writer, high_water=limits.send_queue_bytes)
        if refusal is not None:
            frames.send(_encode(refusal))
            await frames.aclose()
            return
        version = negotiate((hello[0].min_version, hello[0].max_version))
        assert version is not None
        frames.send(_encode(Welcome(version, *NODE_VERSIONS, "walsvc-python")))
        self._connections += 1
        session = _Session(self, frames, peer, self._connections, version)
        self._live.add(session)
        watchdog = session.watchdog = Watchdog(
            limits, frames, session._tasks, lambda reason: self._refuse_peer(peer, reason)
        )
        try:
            while not frames.closed:
                session.handle_frame(_decode(await watchdog.read_frame(reader)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (CorruptRecord, msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._refuse_peer(peer, exc)
        finally:
            watchdog.close()
            self._live.discard(session)
            await session.aclose()
            await frames.aclose(flush_timeout=1.0)

    def _refuse_peer(self, peer: str, error: object) -> None:
        self.refused_peers += 1
        _log.warning("disconnected %s: %s", peer, error)

    def _check_hello(self, hello: Hello) -> Refused | None:
        low, high = NODE_VERSIONS
        if self.draining:
            return Refused(ErrorCode.BACKEND_UNAVAILABLE, DRAINING, low, high)
        if negotiate((hello.min_version, hello.max_version)) is None:
            return Refused(
                ErrorCode.UNSUPPORTED_VERSION,
                f"node speaks versions {low}..{high}",
                low,
                high,
            )
        if self._token is not None and not hmac.compare_digest(
            (hello.token or "").encode(), self._token.encode()
        ):
            return Refused(ErrorCode.UNAUTHENTICATED, "bad or missing token", low, high)
        return None

    async def drain(self, timeout: float = 30.0, reason: str = "node is shutting down") -> None:  # noqa: ASYNC109 (a grace period, not the caller's deadline)
        """Stop within ``timeout`` seconds without dropping an answer owed: no new
        connections, ``GoingAway(reason)`` to every client, the requests received are
        answered (new ones fail), streams end, then ``aclose`` (see ``_drain``)."""
        if self._drained is None:
            self._drained = asyncio.create_task(drain_node(self, timeout, reason))
        await asyncio.shield(self._drained)

    async def aclose(self) -> None:
        """Stop listening, end every connection and close every WAL (at once: ``drain``
        is the graceful way)."""
        if self._server is not None:
            self._server.close()
        sessions = list(self._sessions)
        for task in sessions:
            task.cancel()
        await asyncio.gather(*sessions, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        wals, self._wals = self._wals, {}
        for wal in wals.values():
            await wal.aclose()


@contextlib.asynccontextmanager
async def serve(
    url: str,
    listen: str = "127.0.0.1:0",
    *,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    limits: NodeLimits | None = None,
    **wal_options: Any,
) -> AsyncIterator[NodeServer]:
    """Serve the pchannels of the log at ``url`` (any backend URL) on ``listen``
    (``host:port``; port 0 picks a free one) until the block exits:
    ``async with walsvc.serve("file:///data/wal") as node: ... node.node_url``.

    The node opens each pchannel read-write on its first client's request, with
    ``wal_options`` (``walsvc.open_wal``'s: chain, message size limit, tail cache,
    backend options), and is its single writer. ``token``: clients must present it
    (``open_wal(..., token=...)``). ``tls``: a server-side ``ssl.SSLContext`` (its
    certificate chain loaded; ``verify_mode = CERT_REQUIRED`` with a CA loaded to demand
    client certificates): every connection then starts with a TLS handshake, and a
    client that does not speak TLS is disconnected by it. ``limits``: what the node
    allows each peer (``NodeLimits``: timeouts, bytes queued for a peer that reads too
    little)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"listen must be host:port, not {listen!r}")
    node = NodeServer(url, token=token, wal_options=dict(wal_options), tls=tls, limits=limits)
    await node.start(host.strip("[]") or "127.0.0.1", int(port))
    try:
        yield node
    finally:
        await node.aclose()
