"""One connection to a walsvc node: the handshake, requests matched to their answers by
id, deliveries routed to their streams by number, and what a lost connection does to
what is pending (``AppendOutcomeUnknown`` for an append that was sent,
``BackendUnavailable`` for anything else)."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from typing import TYPE_CHECKING, Any, Final, final

import msgspec

from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    MessageTooLarge,
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
    Hello,
    NodeMessage,
    Read,
    Refused,
    StreamEnded,
    Welcome,
    array_header,
    error_from,
)

if TYPE_CHECKING:
    from ._scanner import RemoteScanner

__all__ = ("Connection",)

_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(list[NodeMessage]).decode
#: Largest encoded request: it must fit in one frame with the frame's array header.
_MAX_ITEM: Final = MAX_FRAME_BYTES - 5


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
        elif isinstance(message, AckFailed):
            scanner = self._streams.get(message.stream)
            if scanner is not None:
                scanner._ack_failed(error_from(message.code, message.message))
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
