"""The client of a walsvc node: one connection, and the WAL and scanners over it.

``RemoteWAL`` has the methods, semantics and errors of a WAL in this process; the node
runs each append through its interceptor chain (it allocates the timeticks) and filters
each stream by header before it sends. Requests carry ids and are answered in any order;
every frame carries as many requests as were queued in one loop turn. A scanner's stream
has credit (messages and payload bytes): the node sends no more than the client granted,
and the client grants more as the user consumes, so a slow reader holds only its window.

Not served yet (each raises ``InvalidArgument`` saying so): transactions, durable
subscriptions and ``ack``, ``truncate``, ``delete_subscription``. A lost
connection fails what is pending (``AppendOutcomeUnknown`` for an append that was sent,
``BackendUnavailable`` for anything else); reconnection comes later.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Final, final

import msgspec

from walsvc.core._api import Scanner, ScannerStats
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    InvalidMessage,
    MessageTooLarge,
    WALClosed,
    WALError,
    WALReadOnly,
)
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, unmarshal_message_id
from walsvc.core._message import (
    SYSTEM_TYPES,
    AppendResult,
    ImmutableMessage,
    Message,
    MessageType,
    TxnContext,
)
from walsvc.wal._api import DEFAULT_TXN_BUFFER_BYTES, WAL
from walsvc.write._txn import Txn

from ._frames import FrameWriter, read_frame
from ._protocol import (
    FRAME_HEADER,
    MAX_FRAME_BYTES,
    NODE_VERSIONS,
    Append,
    Appended,
    AppendMany,
    CloseStream,
    CloseWal,
    Credit,
    Delivered,
    ErrorCode,
    Failed,
    Hello,
    LatestId,
    LatestIdIs,
    NodeMessage,
    Opened,
    OpenWal,
    Read,
    Refused,
    StreamEnded,
    Welcome,
    WireDelivered,
    WireMessage,
    WireResult,
    array_header,
    error_from,
)

__all__ = (
    "DEFAULT_WINDOW_BYTES",
    "DEFAULT_WINDOW_MESSAGES",
    "Connection",
    "RemoteScanner",
    "RemoteWAL",
    "open_remote_wal",
)

_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(list[NodeMessage]).decode
#: Largest encoded request: it must fit in one frame with the frame's array header.
_MAX_ITEM: Final = MAX_FRAME_BYTES - 5
_FROM_THE_START: Final = DeliverPolicy.all()
#: Default credit of a stream: messages and payload bytes the node may send unread.
DEFAULT_WINDOW_MESSAGES: Final = 4096
DEFAULT_WINDOW_BYTES: Final = 8 * 1024 * 1024
_TYPES: Final = {int(t): t for t in MessageType}


def _not_served(what: str) -> InvalidArgument:
    return InvalidArgument(f"{what} is not served over walsvc:// yet (a later protocol version)")


@final
class _Pending:
    """A request waiting for its answer; ``sent`` once it reached the transport."""

    __slots__ = ("append", "future", "sent")

    def __init__(self, future: asyncio.Future[Any], append: bool) -> None:
        self.future = future
        self.append = append
        self.sent = False

    def mark_sent(self) -> None:
        self.sent = True


@final
class _Ids:
    """Parses marshalled ids, finding each scheme's id class once."""

    __slots__ = ("_classes", "_last", "_last_text")

    def __init__(self) -> None:
        self._classes: dict[str, type[MessageId]] = {}
        # The last id parsed: results and messages repeat the same last-confirmed id.
        self._last_text = ""
        self._last: MessageId | None = None

    def __call__(self, text: str) -> MessageId:
        if text == self._last_text and self._last is not None:
            return self._last
        parsed = self._parse(text)
        self._last_text, self._last = text, parsed
        return parsed

    def _parse(self, text: str) -> MessageId:
        scheme, _, position = text.partition(":")
        cls = self._classes.get(scheme)
        if cls is None:
            parsed = unmarshal_message_id(text)
            self._classes[scheme] = type(parsed)
            return parsed
        return cls.from_position(position)


@final
class Connection:
    """One connection to a node: answers matched to requests by id, deliveries to
    streams by number. Made by ``Connection.connect`` (which runs the handshake)."""

    __slots__ = (
        "_ids",
        "_lost",
        "_pending",
        "_reader",
        "_reading",
        "_streams",
        "_where",
        "_writer",
        "received_bytes",
        "version",
    )

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int, where: str
    ) -> None:
        self._reader = reader
        self._writer = FrameWriter(writer)
        self._where = where
        #: The protocol version negotiated.
        self.version = version
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, RemoteScanner] = {}
        self._lost: WALError | None = None
        #: Frame bytes received from the node (length prefixes included).
        self.received_bytes = 0
        self._reading = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        token: str | None = None,
        versions: tuple[int, int] = NODE_VERSIONS,
        connect_timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
    ) -> Connection:
        """Connect to the node at ``host:port`` (over TLS with ``tls``) and run the
        handshake. Raises ``BackendUnavailable`` if it cannot be reached, ``WALError`` if
        it refuses (a certificate that does not verify included)."""
        where = f"walsvc://{host}:{port}"
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        except ssl.SSLCertVerificationError as exc:
            raise WALError(
                f"TLS: the node at {where} has a certificate that does not verify: {exc}"
            ) from exc
        except ssl.SSLError as exc:
            raise BackendUnavailable(
                f"TLS handshake with the node at {where} failed: {exc}"
            ) from exc
        except (OSError, TimeoutError) as exc:
            raise BackendUnavailable(f"cannot reach the node at {where}: {exc}") from exc
        try:
            hello = _encode(Hello(versions[0], versions[1], token, "walsvc-python"))
            head = array_header(1)
            writer.write(FRAME_HEADER.pack(len(head) + len(hello)) + head + hello)
            async with asyncio.timeout(connect_timeout):
                answer = _decode(await read_frame(reader))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            writer.close()
            hint = "" if tls is not None else " (does it require TLS?)"
            raise BackendUnavailable(
                f"the node at {where} did not answer the handshake{hint}"
            ) from exc
        except (msgspec.DecodeError, CorruptRecord) as exc:
            writer.close()
            raise CorruptRecord(f"the node at {where} answered garbage: {exc}") from exc
        first = answer[0] if len(answer) == 1 else None
        if isinstance(first, Welcome):
            return cls(reader, writer, first.version, where)
        writer.close()
        if isinstance(first, Refused):
            if first.code == ErrorCode.UNSUPPORTED_VERSION:
                raise WALError(
                    f"the node at {where} speaks protocol versions"
                    f" {first.min_version}..{first.max_version}; this client speaks"
                    f" {versions[0]}..{versions[1]} ({first.message})"
                )
            raise WALError(f"the node at {where} refused the connection: {first.message}")
        raise CorruptRecord(f"the node at {where} answered the handshake with {answer!r}")

    @property
    def where(self) -> str:
        """The node's URL."""
        return self._where

    def check(self) -> None:
        """Raise the error that ended the connection, if it ended."""
        if self._lost is not None:
            raise type(self._lost)(str(self._lost))

    def request(self, item: msgspec.Struct, request: int, *, append: bool = False) -> _Pending:
        """Queue ``item`` (whose request id is ``request``) and return its pending answer."""
        self.check()
        data = _encode(item)
        if len(data) > _MAX_ITEM:
            raise MessageTooLarge(
                f"the request is {len(data)} bytes encoded; a frame holds {_MAX_ITEM}"
            )
        pending = _Pending(asyncio.get_running_loop().create_future(), append)
        self._pending[request] = pending
        self._writer.send(data, pending.mark_sent if append else None)
        return pending

    def next_id(self) -> int:
        """A request or stream number not used before on this connection."""
        return next(self._ids)

    def send(self, item: msgspec.Struct) -> None:
        """Queue a message that has no answer (credit, stream control)."""
        if self._lost is None:
            self._writer.send(_encode(item))

    def open_stream(self, scanner: RemoteScanner, read: Read) -> None:
        """Register ``scanner`` for the deliveries of ``read`` and send it."""
        self.check()
        self._streams[read.stream] = scanner
        self._writer.send(_encode(read))

    def forget_stream(self, stream: int) -> None:
        """Stop routing deliveries to ``stream`` and tell the node to stop it."""
        if self._streams.pop(stream, None) is not None:
            self.send(CloseStream(stream))

    async def _read(self) -> None:
        reason: WALError = BackendUnavailable(f"the connection to {self._where} closed")
        try:
            while True:
                body = await read_frame(self._reader)
                self.received_bytes += len(body) + FRAME_HEADER.size
                for message in _decode(body):
                    self._dispatch(message)
        except asyncio.IncompleteReadError:
            pass
        except (OSError, msgspec.DecodeError, msgspec.ValidationError, CorruptRecord) as exc:
            reason = BackendUnavailable(f"the connection to {self._where} failed: {exc}")
        finally:
            self._fail_all(reason)

    def _dispatch(self, message: NodeMessage) -> None:
        if type(message) is Appended:  # the common answer first
            pending = self._pending.pop(message.request, None)
            if pending is not None and not pending.future.done():
                pending.future.set_result(message)
        elif isinstance(message, Delivered):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._deliver(message.messages)
        elif isinstance(message, StreamEnded):
            scanner = self._streams.pop(message.stream, None)
            if scanner is not None:
                scanner._finish(
                    None
                    if message.code == ErrorCode.OK
                    else error_from(message.code, message.message)
                )
        elif isinstance(message, Welcome | Refused):
            raise CorruptRecord(f"{type(message).__name__} after the handshake")
        else:
            pending = self._pending.pop(message.request, None)
            if pending is None or pending.future.done():
                return
            if isinstance(message, Failed):
                pending.future.set_exception(error_from(message.code, message.message))
            else:
                pending.future.set_result(message)

    def _fail_all(self, reason: WALError) -> None:
        if self._lost is None:
            self._lost = reason
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            if entry.future.done():
                continue
            if entry.append and entry.sent and not isinstance(reason, WALClosed):
                entry.future.set_exception(
                    AppendOutcomeUnknown(
                        f"the append was sent to {self._where} and the connection was lost"
                        f" before its answer ({reason})"
                    )
                )
            else:
                entry.future.set_exception(type(reason)(str(reason)))
        streams, self._streams = self._streams, {}
        for scanner in streams.values():
            scanner._finish(type(reason)(str(reason)))

    async def aclose(self) -> None:
        """Send what is queued, close the connection; pending calls raise ``WALClosed``."""
        await self._writer.aclose()
        self._reading.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)
        self._fail_all(WALClosed(f"the connection to {self._where} was closed"))


def _wire(message: Message) -> WireMessage:
    return WireMessage(
        message.payload,
        message.vchannel,
        int(message.type),
        dict(message.properties),
        message.idempotency_key,
    )


def _check_user_message(message: Message) -> None:
    if not isinstance(message, Message):
        raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
    if message.type in SYSTEM_TYPES:
        raise InvalidMessage(
            f"{message.type.name} messages are written by the WAL itself"
            " (transactions: use WAL.begin_txn)"
        )
    if message.txn is not None:
        raise InvalidMessage("transaction messages are appended through WAL.begin_txn")


def _cost(message: WireDelivered) -> int:
    """What a delivered message counts against a stream's byte credit (its payload's
    bytes; a TXN's: its body's too). The node counts the same."""
    cost = len(message.payload)
    for inner in message.body:
        cost += len(inner.payload)
    return cost


@final
class RemoteWAL(WAL):
    """A WAL whose writer is a walsvc node (``walsvc.open_wal("walsvc://host:port",
    pchannel)``): the same methods, semantics and errors as a WAL in this process, for
    what this protocol version serves (see the module docstring)."""

    __slots__ = (
        "_closed",
        "_conn",
        "_handle",
        "_ids",
        "_lc_ids",
        "_pchannel",
        "_read_only",
        "_scanners",
        "_scheme",
        "_term",
        "_window",
    )

    def __init__(
        self,
        conn: Connection,
        opened: Opened,
        pchannel: str,
        window: tuple[int, int],
    ) -> None:
        self._conn = conn
        self._handle = opened.wal
        self._term = opened.term
        self._read_only = opened.read_only
        self._scheme = opened.scheme
        self._pchannel = pchannel
        self._closed = False
        self._ids = _Ids()
        self._lc_ids = _Ids()  # its own one-entry cache: last-confirmed ids repeat
        self._scanners: set[RemoteScanner] = set()
        self._window = window

    @property
    def pchannel(self) -> str:
        """The physical channel this WAL writes and reads."""
        return self._pchannel

    @property
    def read_only(self) -> bool:
        """True if the WAL was opened read-only."""
        return self._read_only

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called."""
        return self._closed

    @property
    def term(self) -> int:
        """The node's writer term (0 when read-only)."""
        return 0 if self._read_only else self._term

    @property
    def connection(self) -> Connection:
        """The connection to the node (for tools and tests)."""
        return self._conn

    @property
    def url(self) -> str:
        """The node's URL (``walsvc://host:port``)."""
        return self._conn.where

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosed(f"WAL {self._pchannel!r} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise WALReadOnly(f"WAL {self._pchannel!r} was opened read-only")

    def _result(self, wire: WireResult) -> AppendResult:
        lc = wire.last_confirmed_id
        return AppendResult(
            self._ids(wire.message_id), wire.timetick, None if lc is None else self._lc_ids(lc)
        )

    async def wait_ready(self) -> None:
        """The node's writer starts before it serves an append: nothing to wait for."""
        self._check_open()

    async def append(self, message: Message) -> AppendResult:
        """Append one message through the node's interceptor chain; return its id,
        timetick and last-confirmed id once it is durable."""
        self._check_writable()
        if type(message) is not Message or message.type in SYSTEM_TYPES or message.txn is not None:
            _check_user_message(message)
        conn = self._conn
        request = conn.next_id()
        pending = conn.request(Append(request, self._handle, _wire(message)), request, append=True)
        answer: Appended = await pending.future
        return self._result(answer.results[0])

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages in order, as one request; return their results once all are
        durable (``WAL.append_many``'s semantics, on the node)."""
        self._check_writable()
        batch = list(messages)
        for message in batch:
            _check_user_message(message)
        if not batch:
            return []
        conn = self._conn
        request = conn.next_id()
        item = AppendMany(request, self._handle, [_wire(m) for m in batch])
        pending = conn.request(item, request, append=True)
        answer: Appended = await pending.future
        return [self._result(r) for r in answer.results]

    async def begin_txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> Txn:
        """Not served over walsvc:// yet: raises ``InvalidArgument``."""
        self._check_writable()
        raise _not_served("begin_txn (transactions)")

    def read(
        self,
        deliver: DeliverPolicy = _FROM_THE_START,
        filters: Iterable[Filter] = (),
        *,
        raw: bool = False,
        timeticks: bool = False,
        use_cache: bool = True,
        subscription: str | None = None,
        txn_buffer_bytes: int = DEFAULT_TXN_BUFFER_BYTES,
        checkpoint_interval: float = 1.0,
    ) -> RemoteScanner:
        """A scanner fed by the node (``WAL.read``'s semantics; the node filters by
        header before it sends, and sends no more than the stream's credit).
        ``use_cache`` is the node's choice (it reads its tail cache when it can);
        ``subscription`` is not served over walsvc:// yet (``InvalidArgument``)."""
        self._check_open()
        if not isinstance(deliver, DeliverPolicy):
            raise TypeError(f"deliver must be a walsvc.DeliverPolicy, not {deliver!r}")
        if subscription is not None:
            raise _not_served("subscription (durable subscriptions and ack)")
        if type(txn_buffer_bytes) is not int or txn_buffer_bytes < 0:
            raise InvalidArgument(f"txn_buffer_bytes must be an int >= 0, not {txn_buffer_bytes!r}")
        position = deliver.message_id
        if position is not None and position.scheme != self._scheme:
            raise InvalidArgument(f"{position!r} is not a {self._scheme}:// message id")
        selected = Filter.combine(filters)
        conn = self._conn
        stream = conn.next_id()
        window_messages, window_bytes = self._window
        scanner = RemoteScanner(self, stream, window_messages, window_bytes)
        conn.open_stream(
            scanner,
            Read(
                stream,
                self._handle,
                deliver.kind,
                None if position is None else position.marshal(),
                deliver.after_timetick,
                None if selected.vchannels is None else sorted(selected.vchannels),
                None if selected.types is None else sorted(selected.types),
                selected.min_timetick,
                bool(timeticks),
                bool(raw),
                txn_buffer_bytes,
                window_messages,
                window_bytes,
            ),
        )
        self._scanners.add(scanner)
        return scanner

    async def delete_subscription(self, name: str) -> None:
        """Not served over walsvc:// yet: raises ``InvalidArgument``."""
        self._check_open()
        raise _not_served("delete_subscription (durable subscriptions)")

    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended (even if since truncated),
        or None if nothing was ever appended."""
        self._check_open()
        conn = self._conn
        request = conn.next_id()
        answer: LatestIdIs = await conn.request(LatestId(request, self._handle), request).future
        return None if answer.message_id is None else self._ids(answer.message_id)

    async def truncate(self, message_id: MessageId) -> None:
        """Not served over walsvc:// yet: raises ``InvalidArgument``."""
        self._check_writable()
        raise _not_served("truncate")

    async def aclose(self) -> None:
        """Close every scanner (their reads raise ``WALClosed``), release the node's
        handle and close the connection. Idempotent. The node's writer stays open for
        its other clients."""
        if self._closed:
            return
        self._closed = True
        scanners, self._scanners = self._scanners, set()
        for scanner in scanners:
            scanner._close_for_wal()
        conn = self._conn
        try:
            request = conn.next_id()
            pending = conn.request(CloseWal(request, self._handle), request)
            async with asyncio.timeout(5.0):
                await pending.future
        except (WALError, TimeoutError):
            pass  # the node releases a connection's handles when it closes anyway
        await conn.aclose()

    def _forget_scanner(self, scanner: RemoteScanner) -> None:
        self._scanners.discard(scanner)

    def _message(self, wire: WireDelivered) -> ImmutableMessage:
        ids = self._ids
        lc = wire.last_confirmed_id
        txn = wire.txn
        type_ = _TYPES.get(wire.type)
        return ImmutableMessage(
            ids(wire.message_id),
            wire.timetick,
            wire.vchannel,
            MessageType(wire.type) if type_ is None else type_,
            wire.payload,
            wire.properties,
            None if lc is None else self._lc_ids(lc),
            None if txn is None else TxnContext(*txn),
            wire.idempotency_key,
            wire.term,
            wire.persisted,
            tuple(self._message(inner) for inner in wire.body),
            wire.durable_tick,
        )

    def __repr__(self) -> str:
        mode = "ro" if self._read_only else f"rw term={self._term}"
        state = " closed" if self._closed else ""
        return f"<walsvc.WAL {self._conn.where} {self._pchannel} {mode}{state}>"


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
        "_stream",
        "_user_closed",
        "_waiter",
        "_wal",
        "_window_bytes",
        "_window_messages",
    )

    def __init__(
        self, wal: RemoteWAL, stream: int, window_messages: int, window_bytes: int
    ) -> None:
        self._wal = wal
        self._stream = stream
        self._window_messages = window_messages
        self._window_bytes = window_bytes
        super().__init__()
        self._buffer: deque[list[WireDelivered]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: Why the stream ended: None while it runs; ``_CLOSED`` for a normal end.
        self._end: WALError | object | None = None
        self._user_closed = False
        self._delivered = 0
        self._owed_messages = 0
        self._owed_bytes = 0
        self._position: MessageId | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _deliver(self, messages: list[WireDelivered]) -> None:
        if messages and self._end is None:
            self._buffer.append(messages)
            self._wake()

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
        raise _not_served("ack (durable subscriptions)")

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


async def open_remote_wal(
    url: str,
    pchannel: str,
    *,
    read_only: bool = False,
    token: str | None = None,
    versions: tuple[int, int] = NODE_VERSIONS,
    window_messages: int = DEFAULT_WINDOW_MESSAGES,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    connect_timeout: float = 10.0,
    tls: ssl.SSLContext | None = None,
) -> RemoteWAL:
    """Open ``pchannel`` on the node at ``url`` (``walsvc://host:port``) over a new
    connection (see ``walsvc.open_wal``)."""
    location = url.removeprefix("walsvc://").rstrip("/")
    host, sep, port_text = location.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"{url!r} is not a node URL (expected walsvc://host:port)")
    for name, value in (("window_messages", window_messages), ("window_bytes", window_bytes)):
        if type(value) is not int or value < 1:
            raise InvalidArgument(f"{name} must be an int >= 1, not {value!r}")
    host = host.strip("[]")
    conn = await Connection.connect(
        host,
        int(port_text),
        token=token,
        versions=versions,
        connect_timeout=connect_timeout,
        tls=tls,
    )
    try:
        request = conn.next_id()
        opened: Opened = await conn.request(OpenWal(request, pchannel, read_only), request).future
    except BaseException:
        await conn.aclose()
        raise
    return RemoteWAL(conn, opened, pchannel, (window_messages, window_bytes))
