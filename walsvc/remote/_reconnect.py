"""How a ``Connection`` notices that its socket is lost and replaces it. A friend of
``_connection``: it reads and sets the connection's private state.

- The heartbeat (``watch``): after ``heartbeat`` seconds without a frame from the node
  the client pings; after twice that it drops the socket.
- A lost socket (``socket_lost``: closed, reset, silent, or closed by a node going away)
  fails everything pending at once if the connection does not reconnect. Otherwise the
  book keeps what may go out again (``PendingRequests``) and ``reconnect`` dials again,
  with backoff, for up to ``reconnect_timeout`` seconds; after that everything pending
  fails ``BackendUnavailable`` (the next call dials again), and a refusal, or a WAL that
  cannot be reopened, ends the connection for good.
- On the new socket (``restore``) the WAL is reopened first (``reopen``, through
  ``Connection.direct``: ahead of everything queued), then the node is asked what
  became of the appends sent before (``_recall``, protocol version 3), then the book
  resends what is left, then each stream is resumed right after the last message it
  received.
- A resumed subscription stream whose name the node still holds for the reader of the
  old connection is read again, with backoff (``read_again``), for up to
  ``reconnect_timeout``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Final

import msgspec

from walsvc.core._errors import BackendUnavailable, SubscriptionBusy, WALError
from walsvc.core._metrics import CLIENT

from ._dial import NodeSocket, dial
from ._protocol import RECALL_VERSION, ErrorCode, Ping
from ._recall import recall

if TYPE_CHECKING:
    from ._connection import Connection
    from ._scanner import RemoteScanner

__all__ = ("read_again", "reconnect", "restore", "resumable", "socket_lost", "watch")

_log: Final = logging.getLogger("walsvc.remote")
_encode: Final = msgspec.msgpack.Encoder().encode
_FIRST_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 1.0


async def watch(conn: Connection) -> None:
    """The heartbeat of ``conn``: ping after ``heartbeat`` seconds of silence; drop the
    socket after twice that."""
    loop = asyncio.get_running_loop()
    nonce = itertools.count(1)
    while conn._lost is None:
        await asyncio.sleep(conn._heartbeat / 2)
        socket = conn._socket
        if socket is None:
            continue
        silent = loop.time() - conn._heard
        if silent >= 2 * conn._heartbeat:
            socket.writer.abort()
            socket_lost(conn, socket, f"{conn.where} was silent for {silent:.1f} s")
        elif silent >= conn._heartbeat:
            socket.writer.send(_encode(Ping(next(nonce))))


def socket_lost(conn: Connection, socket: NodeSocket, reason: str) -> None:
    """``socket`` of ``conn`` is lost (``reason``): fail what is pending, or keep what
    may go out again and reconnect."""
    if conn._socket is not socket:
        return  # already replaced
    conn._socket = None
    conn._spawn(socket.writer.aclose(flush_timeout=0))
    if conn._closing or conn._lost is not None:
        return
    if conn._reconnect_timeout <= 0 or conn._reopen is None:
        conn._fail_all(BackendUnavailable(reason))
        return
    _log.info("%s; reconnecting", reason)
    CLIENT.connections_lost += 1
    conn._keep_resendable(reason, conn.where)
    if not conn._reconnecting:  # else the running attempt dials again
        conn._reconnecting = True
        conn._spawn(reconnect(conn, reason))


async def reconnect(conn: Connection, reason: str) -> None:
    """Dial the node of ``conn`` again, with backoff, until a new socket is restored or
    ``reconnect_timeout`` passes (then everything pending fails)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + conn._reconnect_timeout
    delay = _FIRST_BACKOFF
    last: Exception | None = None
    while not conn._closing:
        remaining = deadline - loop.time()
        try:
            socket = await dial(
                conn._address, max(0.01, min(conn._address.connect_timeout, remaining))
            )
            await restore(conn, socket)
            conn.reconnects += 1
            CLIENT.reconnects += 1
            return
        except BackendUnavailable as exc:
            last = exc
        except WALError as exc:  # refused, or the WAL cannot be reopened: final
            conn._fail_all(type(exc)(f"{reason}, and reconnecting failed: {exc}"))
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, _MAX_BACKOFF)
    if conn._closing:
        return  # aclose fails what is pending, with WALClosed
    conn._fail_all(  # not for good: the next call dials again
        BackendUnavailable(
            f"{reason}, and it could not be reconnected within"
            f" {conn._reconnect_timeout:g} s ({last})"
        ),
        final=False,
    )


async def restore(conn: Connection, socket: NodeSocket) -> None:
    """Reopen the WAL of ``conn`` on ``socket``, then resend and resume on it."""
    conn._install(socket)
    assert conn._reopen is not None
    try:
        handle = conn._handle = await conn._reopen(conn)
        if socket.version >= RECALL_VERSION:
            await recall(conn, handle)
    except BaseException:
        conn._socket = None
        socket.writer.abort()
        raise
    conn._resend(socket, handle, conn.where)
    for scanner in list(conn._streams.values()):
        if not scanner._user_closed or scanner._closing:
            socket.writer.send(_encode(scanner._resume(handle)))
    conn._reconnecting = False  # from here requests go straight out again


async def read_again(conn: Connection, scanner: RemoteScanner) -> None:
    """Send a resumed subscription stream's ``Read`` again, with backoff, while the
    node still holds the name for the reader of a connection it has yet to close;
    past ``reconnect_timeout`` the stream ends with ``SubscriptionBusy``."""
    loop = asyncio.get_running_loop()
    deadline = scanner._busy_since = scanner._busy_since or loop.time()
    deadline += conn._reconnect_timeout
    await asyncio.sleep(min(_MAX_BACKOFF, 0.02 * 2 ** min(scanner._busy_tries, 6)))
    scanner._busy_tries += 1
    if conn._streams.get(scanner._stream) is not scanner:
        return  # closed meanwhile
    if loop.time() > deadline:
        del conn._streams[scanner._stream]
        scanner._finish(
            SubscriptionBusy(
                f"subscription {scanner._read.subscription!r} stayed busy on"
                f" {conn.where} for {conn._reconnect_timeout:g} s after a reconnect"
            )
        )
    elif conn._sending and conn._handle is not None:
        conn.send(scanner._resume(conn._handle))


def resumable(conn: Connection, code: int) -> bool:
    """Whether a stream of ``conn`` that the node ended with ``code`` resumes on the
    next socket: it does when the node's shutdown ended it (``WAL_CLOSED``,
    ``BACKEND_UNAVAILABLE``) and ``conn`` reconnects and is not closing."""
    return (
        code in (ErrorCode.WAL_CLOSED, ErrorCode.BACKEND_UNAVAILABLE)
        and conn._reconnect_timeout > 0
        and conn._reopen is not None
        and not conn._closing
    )
