"""A client's link to a walsvc node: requests matched to their answers by id, deliveries
routed to their streams by number, a heartbeat, and reconnection.

A ``Connection`` outlives its sockets. When one is lost (closed, reset, silent past the
heartbeat, or the node going away) the connection dials again, with backoff, for up to
``reconnect_timeout`` seconds; it reopens its WAL's handle, resends every request that
is safe to resend (appends carry idempotency keys: the node's dedup window answers a
resend of an append that landed with its first result) and resumes every stream right
after the last message it received. What is not safe to resend fails:
``AppendOutcomeUnknown`` for an append that may have reached the node,
``BackendUnavailable`` for anything else. When the node cannot be reached in time,
everything pending fails that way, and the connection waits: the next request or stream
dials the node again (for another ``reconnect_timeout``), so a client outlives a node
that was away for longer.

The parts: ``_dial`` reaches a node (the handshake); ``_pending`` keeps the requests
waiting for answers and the rules for resending them (the book ``Connection`` inherits);
``_reconnect`` notices a lost socket (the heartbeat) and replaces it; this module sends
requests, keeps the streams, and dispatches what the node sends to both.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, final

import msgspec

from walsvc.core._errors import (
    BackendUnavailable,
    CorruptRecord,
    MessageTooLarge,
    WALClosed,
    WALError,
)

from ._dial import NodeAddress, NodeSocket, dial
from ._frames import MAX_ITEM_BYTES, read_frame
from ._pending import Pending, PendingRequests
from ._protocol import (
    FRAME_HEADER,
    NODE_VERSIONS,
    AckFailed,
    Appended,
    CloseStream,
    Delivered,
    ErrorCode,
    Failed,
    GoingAway,
    NodeMessage,
    Pong,
    Read,
    Refused,
    StreamEnded,
    StreamStarted,
    StreamStats,
    Welcome,
    error_from,
)
from ._reconnect import goes_on, reconnect, socket_lost, watch

if TYPE_CHECKING:
    from ._scanner import RemoteScanner

__all__ = ("DEFAULT_HEARTBEAT", "DEFAULT_RECONNECT_TIMEOUT", "Connection")

_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(list[NodeMessage]).decode
#: Seconds a lost connection is redialled before what is pending fails.
DEFAULT_RECONNECT_TIMEOUT: Final = 30.0
#: Seconds of silence after which the client pings; as long again without any frame
#: from the node and the socket is dropped (and redialled).
DEFAULT_HEARTBEAT: Final = 5.0

#: Reopens the connection's WAL on a new socket; returns the new handle.
Reopen = Callable[["Connection"], Awaitable[int]]


@final
class Connection(PendingRequests):
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
        "_reconnect_timeout",
        "_reconnecting",
        "_reopen",
        "_socket",
        "_streams",
        "_tasks",
        "going_away",
        "received_bytes",
        "reconnects",
        "seen_tick",
        "version",
    )

    def __init__(
        self,
        address: NodeAddress,
        socket: NodeSocket,
        *,
        reconnect_timeout: float,
        heartbeat: float,
    ) -> None:
        super().__init__()
        self._address = address
        self._reconnect_timeout = reconnect_timeout
        self._heartbeat = heartbeat
        #: The protocol version negotiated (on the current socket: a reconnect may
        #: reach a node that speaks another).
        self.version = socket.version
        self._ids = itertools.count(1)
        self._streams: dict[int, RemoteScanner] = {}
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
        #: The newest timetick among the answers received (each ``Appended``'s first
        #: result, and what ``Opened`` says), 0 before one: whatever is sent from now on
        #: lands after it.
        self.seen_tick = 0
        # The loop this connection lives on (asyncio.get_running_loop() costs a getpid
        # system call on every call: not once per request).
        self._loop = asyncio.get_running_loop()
        self._heard = self._loop.time()
        self._socket: NodeSocket | None = None
        self._install(socket)
        if heartbeat > 0:
            self._spawn(watch(self))

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
        socket = await dial(address, connect_timeout)
        return cls(address, socket, reconnect_timeout=reconnect_timeout, heartbeat=heartbeat)

    @property
    def where(self) -> str:
        """The node's URL."""
        return self._address.url

    def on_reconnect(self, reopen: Reopen) -> None:
        """Run ``reopen`` on each new socket before anything is resent: it reopens the
        connection's WAL and returns the handle requests and streams now name."""
        self._reopen = reopen

    def request(
        self,
        item: msgspec.Struct | bytes,
        request: int,
        *,
        append: bool = False,
        resend: bool = False,
        resend_from: int = 1,
        hold: bool = True,
    ) -> Pending:
        """Queue ``item`` (whose request id is ``request``) and return its pending
        answer. ``item`` is a client message, or its msgpack bytes as ``_encode`` makes
        them (the compiled append path encodes its own). ``append``: its loss is
        ``AppendOutcomeUnknown``; ``resend``: it is sent again after a reconnect instead
        of failing, to a node that speaks protocol version ``resend_from`` or later (a
        resend needs what that version added); ``hold=False``: while there is no socket
        to send it on now, it fails ``BackendUnavailable`` instead of waiting for the
        next (a request that names something of this socket, which the next may not
        have yet)."""
        self.check()
        if not hold and not self._sending:
            raise BackendUnavailable(f"no connection to {self.where} now")
        data = item if type(item) is bytes else _encode(item)
        if len(data) > MAX_ITEM_BYTES:
            raise MessageTooLarge(
                f"the request is {len(data)} bytes encoded; a frame holds {MAX_ITEM_BYTES}"
            )
        pending = Pending(
            self._loop.create_future(),
            item,
            append,
            resend,
            len(data),
            resend_from,
            self.seen_tick,
        )
        # PendingRequests._add, inline: this runs per append
        self._pending[request] = pending
        self._pending_bytes += len(data)
        if self._sending:
            socket = self._socket
            assert socket is not None
            socket.writer.send(data, pending.mark_sent if append else None)
        else:
            pending.held = True
            self._redial()
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

    def _redial(self) -> None:
        """Dial the node again if no socket is up and no attempt runs: the last one gave
        up after ``reconnect_timeout`` (what was pending then failed), and a new call
        came. Connections that do not reconnect stay down."""
        if (
            self._socket is None
            and not self._reconnecting
            and self._lost is None
            and not self._closing
            and self._reconnects_at_all
        ):
            self._reconnecting = True
            self._spawn(reconnect(self, f"no connection to {self.where}"))

    @property
    def _reconnects_at_all(self) -> bool:
        return self._reconnect_timeout > 0 and self._reopen is not None

    def saw_tick(self, timetick: int) -> None:
        """Note that the node had given ``timetick`` (what it says when a WAL opens):
        whatever is sent from now on lands after it (``seen_tick``)."""
        if timetick > self.seen_tick:
            self.seen_tick = timetick

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
        else:
            self._redial()

    def forget_stream(self, stream: int) -> None:
        """Stop routing deliveries to ``stream`` and tell the node to stop it."""
        if self._streams.pop(stream, None) is not None:
            self.send(CloseStream(stream))

    # -- sockets ----------------------------------------------------------------------

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _install(self, socket: NodeSocket) -> None:
        self._socket = socket
        self.version = socket.version
        self.going_away = None
        self._heard = asyncio.get_running_loop().time()
        self._spawn(self._read(socket))

    async def _read(self, socket: NodeSocket) -> None:
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
        socket_lost(self, socket, reason)

    def direct(self, item: msgspec.Struct, request: int) -> asyncio.Future[Any]:
        """Send ``item`` now on the current socket, ahead of what waits to be resent
        (``reopen`` uses it); its answer arrives on the returned future."""
        socket = self._socket
        if socket is None:
            raise BackendUnavailable(f"no connection to {self.where}")
        pending = Pending(asyncio.get_running_loop().create_future(), item, False, False)
        self._add(request, pending)
        socket.writer.send(_encode(item))
        return pending.future

    # -- answers ----------------------------------------------------------------------

    def _dispatch(self, message: NodeMessage) -> None:
        if type(message) is Appended:  # the common answer first
            pending = self._answered(message.request)
            if pending is not None and not pending.future.done():
                pending.future.set_result(message)
            results = message.results
            if results and results[0].timetick > self.seen_tick:
                self.seen_tick = results[0].timetick
        elif isinstance(message, Delivered):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._deliver(message.messages)
        elif isinstance(message, StreamStats):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._stats_arrived(message)
        elif isinstance(message, StreamEnded):
            scanner = self._streams.get(message.stream)
            if scanner is not None and not goes_on(self, scanner, message):
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
                self._hold(message.request, pending)
                return
            if isinstance(message, Failed):
                pending.future.set_exception(error_from(message.code, message.message))
            else:
                pending.future.set_result(message)

    def _fail_all(self, reason: WALError, *, final: bool = True) -> None:
        """Fail every request and stream with ``reason``; for good if ``final``, else
        the next request or stream dials the node again (``_redial``)."""
        self._reconnecting = False
        self._end(reason, self.where, final=final)
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
