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
- A stream the node ends (``goes_on``) is not over for a connection that reconnects
  when the node is going away (it resumes on the next socket), when the node's read
  failed transiently while the node stays (``WAL_CLOSED``, ``BACKEND_UNAVAILABLE``), or
  when a resumed subscription's name is still held for the reader of the old
  connection (``SUBSCRIPTION_BUSY``): its ``Read`` then goes out again on the same
  socket, with backoff (``read_again``), until ``reconnect_timeout`` has passed since
  the stream last ran.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Final

import msgspec

from walsvc.core._errors import BackendUnavailable, WALError
from walsvc.core._metrics import CLIENT

from ._dial import NodeSocket, dial
from ._node_messages import StreamEnded
from ._protocol import RECALL_VERSION, ErrorCode, Ping, error_from
from ._recall import recall

if TYPE_CHECKING:
    from ._connection import Connection
    from ._scanner import RemoteScanner

__all__ = ("goes_on", "reconnect", "restore", "socket_lost", "watch")

_log: Final = logging.getLogger("walsvc.remote")
_encode: Final = msgspec.msgpack.Encoder().encode
_FIRST_BACKOFF: Final = 0.05
_MAX_BACKOFF: Final = 1.0
#: How a node ends a stream it cannot go on with for now: a read that failed
#: transiently, or a shutdown.
_TRANSIENT_ENDS: Final = (ErrorCode.WAL_CLOSED, ErrorCode.BACKEND_UNAVAILABLE)


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


def goes_on(conn: Connection, scanner: RemoteScanner, ended: StreamEnded) -> bool:
    """Whether the stream of ``scanner``, which the node ended with ``ended``, goes on
    (else it ends with ``ended``'s error). It does only if ``conn`` reconnects and is
    not closing, and then:

    - ended by a node going away (``WAL_CLOSED``, ``BACKEND_UNAVAILABLE`` after
      ``GoingAway``): it resumes on the next socket (``restore``);
    - ended with those codes by a node that stays (its read of the log failed), or a
      resumed subscription stream answered ``SUBSCRIPTION_BUSY``: its ``Read`` goes out
      again on this socket, with backoff (``read_again``)."""
    if not conn._reconnects_at_all or conn._closing:
        return False
    code = ended.code
    if code in _TRANSIENT_ENDS and conn.going_away is not None:
        scanner._suspend()
        return True
    if code in _TRANSIENT_ENDS or (code == ErrorCode.SUBSCRIPTION_BUSY and scanner._resumed):
        scanner._suspend()
        socket = conn._socket
        if socket is not None:
            conn._spawn(read_again(conn, scanner, socket, error_from(code, ended.message)))
        return True  # with no socket, the next one resumes it
    return False


async def read_again(
    conn: Connection, scanner: RemoteScanner, socket: NodeSocket, error: WALError
) -> None:
    """Resume the stream of ``scanner`` on ``socket`` after a backoff, unless the
    stream was closed or the socket replaced meanwhile (``restore`` resumed it there).
    Once ``reconnect_timeout`` has passed since the stream last ran it ends with
    ``error`` instead. It ran if it delivered (``RemoteScanner._ran``) or stood for
    ``_MAX_BACKOFF`` after its last ``Read`` went out again."""
    loop = asyncio.get_running_loop()
    if scanner._retries and loop.time() - scanner._retried_at >= _MAX_BACKOFF:
        scanner._ran()
    since = scanner._retry_since = scanner._retry_since or loop.time()
    await asyncio.sleep(min(_MAX_BACKOFF, 0.02 * 2 ** min(scanner._retries, 6)))
    scanner._retries += 1
    if conn._streams.get(scanner._stream) is not scanner or conn._socket is not socket:
        return
    if loop.time() > since + conn._reconnect_timeout:
        del conn._streams[scanner._stream]
        scanner._finish(
            type(error)(
                f"{error} (the stream was read again on {conn.where}"
                f" for {conn._reconnect_timeout:g} s)"
            )
        )
    elif conn._sending:
        scanner._retried_at = loop.time()
        CLIENT.streams_read_again += 1
        conn.send(scanner._resume(scanner._wal._handle))
