"""A client's link to a walsvc node: the handshake, requests matched to their answers
by id, deliveries routed to their streams by number, and reconnection.

A ``Connection`` outlives its sockets. When one is lost (closed, reset, silent past the
heartbeat, or the node going away) the connection dials again, with backoff, for up to
``reconnect_timeout`` seconds; it reopens its WAL's handle, resends every request that
is safe to resend (appends carry idempotency keys: the node's dedup window answers a
resend of an append that landed with its first result) and resumes every stream right
after the last message it received. What is not safe to resend fails:
``AppendOutcomeUnknown`` for an append that may have reached the node,
``BackendUnavailable`` for anything else. When the node cannot be reached in time,
everything pending fails that way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, final

import msgspec

from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    MessageTooLarge,
    SubscriptionBusy,
    UnsupportedVersion,
    WALClosed,
    WALError,
)

from ._frames import FrameWriter, read_frame
from ._protocol import (
    FRAME_HEADER,
    MAX_FRAME_BYTES,
    NODE_VERSIONS,
    AckFailed,
    Appended,
    CloseStream,
    Delivered,
    ErrorCode,
    Failed,
    GoingAway,
    Hello,
    NodeMessage,
    Ping,
    Pong,
    Read,
    Refused,
    StreamEnded,
    StreamStarted,
    StreamStats,
    Welcome,
    array_header,
    error_from,
)

if TYPE_CHECKING:
    from ._scanner import RemoteScanner

__all__ = (
    "DEFAULT_HEARTBEAT",
    "DEFAULT_RECONNECT_TIMEOUT",
    "MAX_PENDING",
    "MAX_PENDING_BYTES",
    "Connection",
    "NodeAddress",
)

_log: Final = logging.getLogger("walsvc.remote")
_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(list[NodeMessage]).decode
#: Largest encoded request: it must fit in one frame with the frame's array header.
_MAX_ITEM: Final = MAX_FRAME_BYTES - 5
#: Seconds a lost connection is redialled before what is pending fails.
DEFAULT_RECONNECT_TIMEOUT: Final = 30.0
#: Seconds of silence after which the client pings; as long again without any frame
#: from the node and the socket is dropped (and redialled).
DEFAULT_HEARTBEAT: Final = 5.0
#: Requests (and their encoded bytes) a connection keeps waiting for answers before
#: callers wait for room.
MAX_PENDING: Final = 16384
MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
_FIRST_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 1.0

#: Reopens the connection's WAL on a new socket; returns the new handle.
Reopen = Callable[["Connection"], Awaitable[int]]


@final
class NodeAddress(msgspec.Struct, frozen=True):
    """Where a node is and how to greet it."""

    host: str
    port: int
    token: str | None = None
    tls: ssl.SSLContext | None = None
    versions: tuple[int, int] = NODE_VERSIONS
    connect_timeout: float = 10.0

    @property
    def url(self) -> str:
        """``walsvc://host:port``."""
        return f"walsvc://{self.host}:{self.port}"


@final
class _Pending:
    """A request waiting for its answer. ``sent`` once it reached a transport;
    ``resend``: safe to send again on a new socket (reads, idempotent appends), if the
    node there speaks at least protocol version ``resend_from``; ``resent``: how many
    times it was."""

    __slots__ = (
        "append",
        "future",
        "held",
        "item",
        "resend",
        "resend_from",
        "resent",
        "sent",
        "size",
    )

    def __init__(
        self,
        future: asyncio.Future[Any],
        item: msgspec.Struct,
        append: bool,
        resend: bool,
        size: int = 0,
        resend_from: int = 1,
    ) -> None:
        self.future = future
        self.item = item
        self.size = size
        self.append = append
        self.resend = resend
        self.resend_from = resend_from
        self.resent = 0
        self.sent = False
        #: Not written to any socket yet (kept for the next one): safe to send there.
        self.held = False

    def mark_sent(self) -> None:
        self.sent = True


@final
class _Socket:
    """One TCP (or TLS) connection after its handshake."""

    __slots__ = ("reader", "version", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: FrameWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version


async def _dial(address: NodeAddress, within: float) -> _Socket:
    """Connect and run the handshake. Raises ``BackendUnavailable`` if the node cannot
    be reached in ``within`` seconds (or is draining), ``Unauthenticated`` or
    ``UnsupportedVersion`` if it refuses the token or the versions, ``WALError`` for a
    certificate that does not verify."""
    where, tls, versions = address.url, address.tls, address.versions
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_connection(address.host, address.port, ssl=tls)
    except ssl.SSLCertVerificationError as exc:
        raise WALError(
            f"TLS: the node at {where} has a certificate that does not verify: {exc}"
        ) from exc
    except ssl.SSLError as exc:
        raise BackendUnavailable(f"TLS handshake with the node at {where} failed: {exc}") from exc
    except (OSError, TimeoutError) as exc:
        raise BackendUnavailable(f"cannot reach the node at {where}: {exc}") from exc
    try:
        hello = _encode(Hello(versions[0], versions[1], address.token, "walsvc-python"))
        head = array_header(1)
        writer.write(FRAME_HEADER.pack(len(head) + len(hello)) + head + hello)
        async with asyncio.timeout(within):
            answer = _decode(await read_frame(reader))
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        writer.close()
        hint = "" if tls is not None else " (does it require TLS?)"
        raise BackendUnavailable(f"the node at {where} did not answer the handshake{hint}") from exc
    except (msgspec.DecodeError, msgspec.ValidationError, CorruptRecord) as exc:
        writer.close()
        raise CorruptRecord(f"the node at {where} answered garbage: {exc}") from exc
    first = answer[0] if len(answer) == 1 else None
    if isinstance(first, Welcome):
        return _Socket(reader, FrameWriter(writer), first.version)
    writer.close()
    if isinstance(first, Refused):
        if first.code == ErrorCode.UNSUPPORTED_VERSION:
            raise UnsupportedVersion(
                f"the node at {where} speaks protocol versions"
                f" {first.min_version}..{first.max_version}; this client speaks"
                f" {versions[0]}..{versions[1]} ({first.message})"
            )
        # Unauthenticated for a token refused; BackendUnavailable from a draining node
        raise error_from(first.code, f"the node at {where} refused the connection: {first.message}")
    raise CorruptRecord(f"the node at {where} answered the handshake with {answer!r}")


@final
class Connection:
    """A client's link to a node (see the module docstring): made by
    ``Connection.connect``, which runs the first handshake."""

    __slots__ = (
        "_address",
        "_closing",
        "_handle",
        "_heard",
        "_heartbeat",
        "_ids",
        "_loop",
        "_lost",
        "_pending",
        "_pending_bytes",
        "_reconnect_timeout",
        "_reconnecting",
        "_reopen",
        "_socket",
        "_streams",
        "_tasks",
        "_waiting_room",
        "going_away",
        "received_bytes",
        "reconnects",
        "version",
    )

    def __init__(
        self,
        address: NodeAddress,
        socket: _Socket,
        *,
        reconnect_timeout: float,
        heartbeat: float,
    ) -> None:
        self._address = address
        self._reconnect_timeout = reconnect_timeout
        self._heartbeat = heartbeat
        #: The protocol version negotiated (on the current socket: a reconnect may
        #: reach a node that speaks another).
        self.version = socket.version
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._pending_bytes = 0
        self._waiting_room: deque[asyncio.Future[None]] = deque()
        self._streams: dict[int, RemoteScanner] = {}
        self._lost: WALError | None = None
        self._closing = False
        self._reopen: Reopen | None = None
        #: The WAL handle on the current socket (once a reconnect reopened it).
        self._handle: int | None = None
        self._reconnecting = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Frame bytes received from the node (length prefixes included).
        self.received_bytes = 0
        #: The reason the node of the current socket gave for going away (``GoingAway``:
        #: it will close the socket soon); None until it does.
        self.going_away: str | None = None
        #: Sockets that replaced a lost one.
        self.reconnects = 0
        # The loop this connection lives on (asyncio.get_running_loop() costs a getpid
        # system call on every call: not once per request).
        self._loop = asyncio.get_running_loop()
        self._heard = self._loop.time()
        self._socket: _Socket | None = None
        self._install(socket)
        if heartbeat > 0:
            self._spawn(self._watch())

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
        reconnect_timeout: float = 0.0,
        heartbeat: float = DEFAULT_HEARTBEAT,
    ) -> Connection:
        """Connect to the node at ``host:port`` (over TLS with ``tls``) and run the
        handshake. Raises ``BackendUnavailable`` if it cannot be reached (or is
        draining), ``Unauthenticated`` or ``UnsupportedVersion`` if it refuses the token
        or the versions, ``WALError`` for a certificate that does not verify. A lost
        socket is redialled for ``reconnect_timeout`` seconds (0: not at all)."""
        address = NodeAddress(host, port, token, tls, versions, connect_timeout)
        socket = await _dial(address, connect_timeout)
        return cls(address, socket, reconnect_timeout=reconnect_timeout, heartbeat=heartbeat)

    @property
    def where(self) -> str:
        """The node's URL."""
        return self._address.url

    def on_reconnect(self, reopen: Reopen) -> None:
        """Run ``reopen`` on each new socket before anything is resent: it reopens the
        connection's WAL and returns the handle requests and streams now name."""
        self._reopen = reopen

    def check(self) -> None:
        """Raise the error that ended the connection, if it ended."""
        if self._lost is not None:
            raise type(self._lost)(str(self._lost))

    def request(
        self,
        item: msgspec.Struct,
        request: int,
        *,
        append: bool = False,
        resend: bool = False,
        resend_from: int = 1,
    ) -> _Pending:
        """Queue ``item`` (whose request id is ``request``) and return its pending
        answer. ``append``: its loss is ``AppendOutcomeUnknown``; ``resend``: it is sent
        again after a reconnect instead of failing, to a node that speaks protocol
        version ``resend_from`` or later (a resend needs what that version added)."""
        self.check()
        data = _encode(item)
        if len(data) > _MAX_ITEM:
            raise MessageTooLarge(
                f"the request is {len(data)} bytes encoded; a frame holds {_MAX_ITEM}"
            )
        pending = _Pending(
            self._loop.create_future(),
            item,
            append,
            resend,
            len(data),
            resend_from,
        )
        self._pending[request] = pending
        self._pending_bytes += len(data)
        if self._sending:
            socket = self._socket
            assert socket is not None
            socket.writer.send(data, pending.mark_sent if append else None)
        else:
            pending.held = True
        return pending

    @property
    def _sending(self) -> bool:
        """Whether new requests go out now: a socket is up and not being restored, and
        its node is not going away (then they wait for the next socket, unless this
        connection does not reconnect)."""
        return (
            self._socket is not None
            and not self._reconnecting
            and (self.going_away is None or not self._reconnects_at_all)
        )

    @property
    def _reconnects_at_all(self) -> bool:
        return self._reconnect_timeout > 0 and self._reopen is not None

    @property
    def full(self) -> bool:
        """True while the requests waiting for answers reach ``MAX_PENDING`` or
        ``MAX_PENDING_BYTES``: callers ``await room()`` before adding one."""
        return len(self._pending) >= MAX_PENDING or self._pending_bytes >= MAX_PENDING_BYTES

    async def room(self) -> None:
        """Wait until the connection takes another request (backpressure: a caller that
        fires requests without awaiting them waits here, not in an unbounded queue)."""
        while self.full and self._lost is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting_room.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()

    def _answered(self, request: int) -> _Pending | None:
        """Take the pending request ``request`` off the books (None if unknown)."""
        pending = self._pending.pop(request, None)
        if pending is not None:
            self._pending_bytes -= pending.size
            if self._waiting_room and not self.full:
                waiting, self._waiting_room = self._waiting_room, deque()
                for waiter in waiting:  # each checks again: the first ones may fill it
                    if not waiter.done():
                        waiter.set_result(None)
        return pending

    def next_id(self) -> int:
        """A request or stream number not used before on this connection."""
        return next(self._ids)

    def send(self, item: msgspec.Struct) -> None:
        """Queue a message that has no answer (credit, stream control); dropped while
        no socket is up (a resumed stream starts with fresh credit)."""
        socket = self._socket
        if socket is not None and not self._reconnecting and self._lost is None:
            socket.writer.send(_encode(item))

    def open_stream(self, scanner: RemoteScanner, read: Read) -> None:
        """Register ``scanner`` for the deliveries of ``read`` and send it (on the next
        socket, if none is up)."""
        self.check()
        self._streams[read.stream] = scanner
        if self._sending:  # else the next socket resumes it
            self.send(read)

    def forget_stream(self, stream: int) -> None:
        """Stop routing deliveries to ``stream`` and tell the node to stop it."""
        if self._streams.pop(stream, None) is not None:
            self.send(CloseStream(stream))

    # -- sockets ----------------------------------------------------------------------

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _install(self, socket: _Socket) -> None:
        self._socket = socket
        self.version = socket.version
        self.going_away = None
        self._heard = asyncio.get_running_loop().time()
        self._spawn(self._read(socket))

    async def _read(self, socket: _Socket) -> None:
        reason = f"the connection to {self.where} closed"
        try:
            while True:
                body = await read_frame(socket.reader)
                self._heard = self._loop.time()
                self.received_bytes += len(body) + FRAME_HEADER.size
                for message in _decode(body):
                    self._dispatch(message)
        except asyncio.IncompleteReadError:
            pass
        except (OSError, msgspec.DecodeError, msgspec.ValidationError, CorruptRecord) as exc:
            reason = f"the connection to {self.where} failed: {exc}"
        self._socket_lost(socket, reason)

    async def _watch(self) -> None:
        """The heartbeat: ping after ``heartbeat`` seconds of silence; drop the socket
        after twice that."""
        loop = asyncio.get_running_loop()
        nonce = itertools.count(1)
        while self._lost is None:
            await asyncio.sleep(self._heartbeat / 2)
            socket = self._socket
            if socket is None:
                continue
            silent = loop.time() - self._heard
            if silent >= 2 * self._heartbeat:
                socket.writer.abort()
                self._socket_lost(socket, f"{self.where} was silent for {silent:.1f} s")
            elif silent >= self._heartbeat:
                socket.writer.send(_encode(Ping(next(nonce))))

    def _socket_lost(self, socket: _Socket, reason: str) -> None:
        if self._socket is not socket:
            return  # already replaced
        self._socket = None
        self._spawn(socket.writer.aclose(flush_timeout=0))
        if self._closing or self._lost is not None:
            return
        if self._reconnect_timeout <= 0 or self._reopen is None:
            self._fail_all(BackendUnavailable(reason))
            return
        _log.info("%s; reconnecting", reason)
        for request, pending in list(self._pending.items()):
            if pending.future.done():
                self._answered(request)
            elif not (pending.resend or pending.held):
                self._answered(request)
                self._fail(pending, BackendUnavailable(reason))
        if not self._reconnecting:  # else the running attempt dials again
            self._reconnecting = True
            self._spawn(self._reconnect(reason))

    async def _reconnect(self, reason: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reconnect_timeout
        delay = _FIRST_BACKOFF
        last: Exception | None = None
        while not self._closing:
            remaining = deadline - loop.time()
            try:
                socket = await _dial(
                    self._address, max(0.01, min(self._address.connect_timeout, remaining))
                )
                await self._restore(socket)
                self.reconnects += 1
                return
            except BackendUnavailable as exc:
                last = exc
            except WALError as exc:  # refused, or the WAL cannot be reopened: final
                self._fail_all(type(exc)(f"{reason}, and reconnecting failed: {exc}"))
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, _MAX_BACKOFF)
        self._fail_all(
            BackendUnavailable(
                f"{reason}, and it could not be reconnected within"
                f" {self._reconnect_timeout:g} s ({last})"
            )
        )

    async def _restore(self, socket: _Socket) -> None:
        """Reopen the WAL on ``socket``, then resend and resume on it."""
        self._install(socket)
        assert self._reopen is not None
        try:
            handle = self._handle = await self._reopen(self)
        except BaseException:
            self._socket = None
            socket.writer.abort()
            raise
        writer = socket.writer
        for request, pending in list(self._pending.items()):
            if pending.future.done():
                continue
            if pending.resend_from > socket.version and not pending.held:
                self._answered(request)
                self._fail(
                    pending,
                    BackendUnavailable(
                        f"the node at {self.where} now speaks protocol version"
                        f" {socket.version}, which cannot take this request again"
                    ),
                )
                continue
            if not pending.held:
                pending.resent += 1
            item = pending.item
            if hasattr(item, "wal"):
                item = pending.item = msgspec.structs.replace(item, wal=handle)
            writer.send(_encode(item), pending.mark_sent if pending.append else None)
            pending.held = False
        for scanner in list(self._streams.values()):
            if not scanner._user_closed:
                writer.send(_encode(scanner._resume(handle)))
        self._reconnecting = False  # from here requests go straight out again

    async def _read_again(self, scanner: RemoteScanner) -> None:
        """Send a resumed subscription stream's ``Read`` again, with backoff, while the
        node still holds the name for the reader of a connection it has yet to close;
        past ``reconnect_timeout`` the stream ends with ``SubscriptionBusy``."""
        loop = asyncio.get_running_loop()
        deadline = scanner._busy_since = scanner._busy_since or loop.time()
        deadline += self._reconnect_timeout
        await asyncio.sleep(min(_MAX_BACKOFF, 0.02 * 2 ** min(scanner._busy_tries, 6)))
        scanner._busy_tries += 1
        if self._streams.get(scanner._stream) is not scanner:
            return  # closed meanwhile
        if loop.time() > deadline:
            del self._streams[scanner._stream]
            scanner._finish(
                SubscriptionBusy(
                    f"subscription {scanner._read.subscription!r} stayed busy on"
                    f" {self.where} for {self._reconnect_timeout:g} s after a reconnect"
                )
            )
        elif self._sending and self._handle is not None:
            self.send(scanner._resume(self._handle))

    def direct(self, item: msgspec.Struct, request: int) -> asyncio.Future[Any]:
        """Send ``item`` now on the current socket, ahead of what waits to be resent
        (``reopen`` uses it); its answer arrives on the returned future."""
        socket = self._socket
        if socket is None:
            raise BackendUnavailable(f"no connection to {self.where}")
        pending = _Pending(asyncio.get_running_loop().create_future(), item, False, False)
        self._pending[request] = pending
        socket.writer.send(_encode(item))
        return pending.future

    # -- answers ----------------------------------------------------------------------

    def _dispatch(self, message: NodeMessage) -> None:
        if type(message) is Appended:  # the common answer first
            pending = self._answered(message.request)
            if pending is not None and not pending.future.done():
                pending.future.set_result(message)
        elif isinstance(message, Delivered):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._deliver(message.messages)
        elif isinstance(message, StreamStats):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._node_stats = message
        elif isinstance(message, StreamEnded):
            scanner = self._streams.get(message.stream)
            if (
                scanner is not None
                and message.code == ErrorCode.SUBSCRIPTION_BUSY
                and scanner._resumed
                and self._reconnects_at_all
                and not self._closing
            ):  # the node has yet to close the old connection's reader of the name
                self._spawn(self._read_again(scanner))
            elif scanner is not None and not self._resumable(message.code):
                del self._streams[message.stream]
                scanner._finish(
                    None
                    if message.code == ErrorCode.OK
                    else error_from(message.code, message.message)
                )
        elif isinstance(message, StreamStarted):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._stream_started(message.timetick)
        elif isinstance(message, Pong):
            pass  # hearing it was the point
        elif isinstance(message, AckFailed):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._ack_failed(error_from(message.code, message.message))
        elif isinstance(message, Welcome | Refused):
            raise CorruptRecord(f"{type(message).__name__} after the handshake")
        elif isinstance(message, GoingAway):
            self.going_away = message.reason
        else:
            pending = self._answered(message.request)
            if pending is None or pending.future.done():
                return
            if (
                isinstance(message, Failed)
                and message.code == ErrorCode.BACKEND_UNAVAILABLE
                and self.going_away is not None
                and pending.resend
                and self._reconnects_at_all
            ):  # refused by a draining node: it goes out again on the next socket
                self._pending[message.request] = pending
                self._pending_bytes += pending.size
                pending.held = True
                return
            if isinstance(message, Failed):
                pending.future.set_exception(error_from(message.code, message.message))
            else:
                pending.future.set_result(message)

    def _resumable(self, code: int) -> bool:
        """A stream ended by the node's shutdown resumes on the next socket."""
        return (
            code in (ErrorCode.WAL_CLOSED, ErrorCode.BACKEND_UNAVAILABLE)
            and self._reconnect_timeout > 0
            and self._reopen is not None
            and not self._closing
        )

    def _fail(self, pending: _Pending, reason: WALError) -> None:
        if pending.future.done():
            return
        if pending.append and pending.sent and not isinstance(reason, WALClosed):
            pending.future.set_exception(
                AppendOutcomeUnknown(
                    f"the append was sent to {self.where} and the connection was lost"
                    f" before its answer ({reason})"
                )
            )
        else:
            pending.future.set_exception(type(reason)(str(reason)))

    def _fail_all(self, reason: WALError) -> None:
        if self._lost is None:
            self._lost = reason
        self._reconnecting = False
        pending, self._pending = self._pending, {}
        self._pending_bytes = 0
        for entry in pending.values():
            self._fail(entry, reason)
        waiting, self._waiting_room = self._waiting_room, deque()
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)  # the caller's request then raises the loss
        streams, self._streams = self._streams, {}
        for scanner in streams.values():
            scanner._finish(type(reason)(str(reason)))

    async def aclose(self) -> None:
        """Send what is queued, close the connection; pending calls raise ``WALClosed``."""
        self._closing = True
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.writer.aclose()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fail_all(WALClosed(f"the connection to {self.where} was closed"))
