"""Draining a node (``NodeServer.drain``; ``walsvc serve`` on SIGTERM or SIGINT), so that
it stops without losing an answer it owes:

1. stop accepting connections (one that was mid-handshake is refused with
   ``BACKEND_UNAVAILABLE``);
2. tell every client ``GoingAway(reason, within_ms)``, so it can go elsewhere or wait;
3. answer every request already received (appends finish in the WAL and are
   answered), and keep each connection until its client has sent nothing for
   ``_QUIET`` seconds (what it sent before it heard ``GoingAway`` is answered too); a
   request that arrives from now on fails with
   ``Failed(BACKEND_UNAVAILABLE, "node is draining")`` (a ``Read``: ``StreamEnded``
   with that code), except ``Status``, ``Ping``, ``Credit``, ``CloseStream`` and
   ``CloseWal``;
4. end every stream (``StreamEnded``, ``BACKEND_UNAVAILABLE``), send what is queued and
   close every connection;
5. close the WALs.

All of it within the timeout: what is still running then (an append the backend holds,
a client that does not read) is cut off, as ``NodeServer.aclose`` does at once.
A friend of ``_server``: it reads the node's private state.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

import msgspec

from walsvc.remote._protocol import (
    ClientMessage,
    CloseStream,
    CloseWal,
    Credit,
    ErrorCode,
    Failed,
    GoingAway,
    Ping,
    Read,
    Status,
    StreamEnded,
)

if TYPE_CHECKING:
    from ._server import NodeServer
    from ._session import Session

__all__ = ("DRAINING", "drain_node", "draining_answer")

#: What a request that arrives during the drain is told.
DRAINING: Final = "node is draining"
#: What a draining node still serves: its status, heartbeats, and what winds a session
#: down.
_SERVED: Final = (Status, Ping, Credit, CloseStream, CloseWal)
#: The least time given to each step once the timeout has passed.
_LAST_CHANCE: Final = 0.1
#: A connection closes once its client sent nothing for this long (and nothing it sent
#: waits for an answer): what a client sent before it heard ``GoingAway`` arrives well
#: within it over a LAN. Later arrivals are lost as on a dropped connection (a
#: reconnecting client resends its appends elsewhere).
_QUIET: Final = 0.25


def draining_answer(message: ClientMessage) -> msgspec.Struct | None:
    """What a draining node answers ``message`` instead of serving it, or None to serve
    it."""
    if isinstance(message, _SERVED):
        return None
    if isinstance(message, Read):
        return StreamEnded(message.stream, ErrorCode.BACKEND_UNAVAILABLE, DRAINING)
    request = getattr(message, "request", None)
    if request is None:
        return None
    return Failed(request, ErrorCode.BACKEND_UNAVAILABLE, DRAINING)


async def drain_node(node: NodeServer, seconds: float, reason: str) -> None:
    """Drain ``node`` (see the module docstring), then close it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    node.draining = True
    if node._server is not None:
        node._server.close()
    sessions = list(node._live)
    for session in sessions:  # from now on it refuses new requests (``draining_answer``)
        session.draining = True
        session.send(GoingAway(reason, int(seconds * 1000)))
    await asyncio.gather(*(_wind_down(session, reason, deadline) for session in sessions))
    connections = list(node._sessions)
    if connections:  # their read loops see the connections closed and end
        await asyncio.wait(connections, timeout=max(deadline - loop.time(), _LAST_CHANCE))
    await node.aclose()


async def _wind_down(session: Session, reason: str, deadline: float) -> None:
    """Answer what ``session``'s client asked, until it asks nothing more for ``_QUIET``
    seconds (what it sent before it heard ``GoingAway`` arrives meanwhile and is
    answered, refused), then end its streams and close the connection."""
    loop = asyncio.get_running_loop()
    writer, watchdog = session.writer, session.watchdog
    while not writer.closed and (now := loop.time()) < deadline:
        tasks = list(session.in_flight)
        if tasks:
            await asyncio.wait(tasks, timeout=deadline - now)
            continue
        quiet = _QUIET if watchdog is None else now - watchdog.last_frame
        if quiet >= _QUIET and (watchdog is None or watchdog.frame_started is None):
            last = None if watchdog is None else watchdog.last_frame
            for _ in range(3):  # bytes that arrived with this wake-up are read first
                await asyncio.sleep(0)
            if watchdog is None or (watchdog.last_frame == last and not session.in_flight):
                break
            continue
        await asyncio.sleep(min(max(_QUIET - quiet, 0.01), deadline - now))
    await session.streams.end_all(ErrorCode.BACKEND_UNAVAILABLE, reason)
    await writer.aclose(flush_timeout=max(deadline - loop.time(), _LAST_CHANCE))
