"""Reaching a node: where it is (``node_address`` reads its URL) and how to greet it
(``NodeAddress``), and one dial:
the TCP (or TLS) connection and the handshake that agrees on a protocol version
(``dial``, which returns a ``NodeSocket``). A ``Connection`` dials once to start and
again for each socket it loses.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Final, final

import msgspec

from walsvc.core._errors import (
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    UnsupportedVersion,
    WALError,
)

from ._buffered import open_connection
from ._frames import FrameWriter, read_frame
from ._protocol import (
    FRAME_HEADER,
    NODE_VERSIONS,
    ErrorCode,
    Hello,
    NodeMessage,
    Refused,
    Welcome,
    array_header,
    error_from,
)

__all__ = ("NodeAddress", "NodeSocket", "dial", "node_address")

_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(list[NodeMessage]).decode


def node_address(url: str) -> tuple[str, int]:
    """The host and port of a node URL ``walsvc://host:port`` (``InvalidArgument`` for
    anything else)."""
    location = url.removeprefix("walsvc://").rstrip("/") if url.startswith("walsvc://") else ""
    host, sep, port = location.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{url!r} is not a node URL (expected walsvc://host:port)")
    return host.strip("[]"), int(port)


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
class NodeSocket:
    """One TCP (or TLS) connection after its handshake: frames are read from
    ``reader``, written through ``writer``, and speak protocol ``version``."""

    __slots__ = ("reader", "version", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: FrameWriter, version: int) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version


async def dial(address: NodeAddress, within: float) -> NodeSocket:
    """Connect and run the handshake. Raises ``BackendUnavailable`` if the node cannot
    be reached in ``within`` seconds (or is draining), ``Unauthenticated`` or
    ``UnsupportedVersion`` if it refuses the token or the versions, ``WALError`` for a
    certificate that does not verify."""
    where, tls, versions = address.url, address.tls, address.versions
    try:
        async with asyncio.timeout(within):
            reader, writer = await open_connection(address.host, address.port, ssl=tls)
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
        return NodeSocket(reader, FrameWriter(writer), first.version)
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
