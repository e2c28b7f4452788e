"""``/metrics`` over HTTP, served on the caller's event loop.

A scrape runs the collectors on the loop, between the WAL's own callbacks, so they read
the WALs' state without another thread: no lock, and nothing can change under them.
Each request is one ``GET``; anything else gets 404 or 405, a request line or headers
over 8 KiB or slower than ``REQUEST_TIMEOUT`` a closed connection. The answer is
Prometheus's text format (``prometheus_client.generate_latest``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ("REQUEST_TIMEOUT", "serve_metrics")

#: Seconds a client has to send its request line and headers.
REQUEST_TIMEOUT: Final = 10.0
_MAX_HEAD: Final = 8192


async def serve_metrics(
    registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0
) -> asyncio.Server:
    """Start serving ``registry`` at ``http://host:port/metrics`` on the running loop
    (port 0: any free port; ``server.sockets[0].getsockname()`` tells which). Close the
    returned server to stop."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        except ConnectionError:
            writer.close()
            return
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method != b"GET":
            status, body, kind = b"405 Method Not Allowed", b"GET only\n", b"text/plain"
        elif path != b"/metrics":
            status, body, kind = b"404 Not Found", b"see /metrics\n", b"text/plain"
        else:
            status, body, kind = b"200 OK", generate_latest(registry), CONTENT_TYPE_LATEST.encode()
        writer.write(
            b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (status, kind, len(body))
            + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, host, port, limit=_MAX_HEAD)
