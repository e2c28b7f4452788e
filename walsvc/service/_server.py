"""The walsvc node: one backend's pchannels served to many client processes.

The node is each pchannel's single writer: it opens one WAL per pchannel on first use
(through its interceptor chain, so it is the one timetick authority) and keeps it for
all its clients. ``NodeServer`` listens (TLS wraps every connection when it has a
context), runs each connection's handshake (versions negotiated, the token compared in
constant time; a refusal names the node's versions) and then hands every frame it reads
to the connection's session (``_session``) until the connection closes. A peer that
breaks the protocol (garbage, a length prefix above the limit) or the node's limits
(``_limits``: it does not read, it trickles) is disconnected alone, with one log line.
``drain`` is in ``_drain``, ``status`` in ``_status``; ``serve`` runs a node for the
length of a block.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any, Final, final

import msgspec

from walsvc.core._errors import CorruptRecord, InvalidArgument
from walsvc.core._gather import await_all
from walsvc.core._timetick import HybridClock
from walsvc.remote._buffered import start_server
from walsvc.remote._frames import FrameWriter, read_frame
from walsvc.remote._node_status import NodeLimits, NodeStatus
from walsvc.remote._protocol import (
    NODE_VERSIONS,
    ClientMessage,
    ErrorCode,
    Hello,
    Refused,
    Welcome,
    negotiate,
)
from walsvc.wal._open import open_wal
from walsvc.wal._wal import LocalWAL

from ._drain import DRAINING, drain_node
from ._fences import ProducerFences
from ._limits import Watchdog, keep_alive
from ._session import Session
from ._status import host_port, node_gauges, node_status
from ._txns import NodeTxns
from ._wire import encode

__all__ = ("NodeServer", "serve")

_log: Final = logging.getLogger("walsvc.service")
_decode: Final = msgspec.msgpack.Decoder(list[ClientMessage]).decode


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
        #: Which connection each producer appends through (a reconnect fences the old).
        self.producers = ProducerFences()
        self._opening: dict[str, asyncio.Task[LocalWAL]] = {}
        self._server: asyncio.Server | None = None
        self._address = ("", 0)
        self._sessions: set[asyncio.Task[None]] = set()
        self._live: set[Session] = set()  # the connections past their handshake
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

    def gauges(self) -> dict[str, float]:
        """The node's figures for a metrics scrape, now (see ``node_gauges``)."""
        return node_gauges(self)

    async def status(self, subscriptions: bool = False) -> NodeStatus:
        """The node's status now (a ``NodeStatus``: what ``walsvc status`` shows), with
        each pchannel's durable subscriptions if ``subscriptions``."""
        return await node_status(self, subscriptions)

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
        self._server = await start_server(
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
            frames.send(encode(refusal))
            await frames.aclose()
            return
        version = negotiate((hello[0].min_version, hello[0].max_version))
        assert version is not None
        frames.send(encode(Welcome(version, *NODE_VERSIONS, "walsvc-python")))
        self._connections += 1
        session = Session(self, frames, peer, self._connections, version)
        self._live.add(session)
        watchdog = session.watchdog = Watchdog(
            limits, frames, session.in_flight, lambda reason: self._refuse_peer(peer, reason)
        )
        try:
            while not frames.closed:
                body = await watchdog.read_frame(reader)
                if frames.closed:  # cut off while the frame came: a second fault unlogged
                    break
                session.handle_frame(_decode(body))
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
        """Stop listening, end every connection and close every WAL, the WALs together
        (the first error is raised once all are closed). Abrupt: ``drain`` is the
        graceful way."""
        if self._server is not None:
            self._server.close()
        sessions = list(self._sessions)
        for task in sessions:
            task.cancel()
        await asyncio.gather(*sessions, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        wals, self._wals = self._wals, {}
        # Together, as a local Node closes its WALs: each close is bounded by its
        # backend's close timeout, and the node's by the slowest, not their sum.
        await await_all(wal.aclose() for wal in wals.values())


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
