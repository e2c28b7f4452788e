"""The requests a connection waits for answers to, and what a lost socket does to each.

A request is ``Pending`` from the moment it is queued until its answer arrives or it
fails. The book of them (``PendingRequests``) is bounded: past ``MAX_PENDING`` requests
or ``MAX_PENDING_BYTES`` encoded bytes, callers wait for ``room``. When a socket is lost,
the book keeps what may go out on the next one, naming the WAL by its new handle, and
fails the rest:

- a request never written to a socket (``held``) stays;
- a request safe to send again (``resend``: reads, appends with idempotency keys) stays
  too, and goes out again if the node of the next socket speaks the protocol version
  its resend needs (``resend_from``); else it fails ``BackendUnavailable`` there. A
  request queued as its bytes (the compiled append path) is decoded back into its
  message first, to name the new handle: the same message, producer keys and all;
- any other fails at once: an append that reached a transport with
  ``AppendOutcomeUnknown`` (it may have landed), anything else with the loss.

``Connection`` is a ``PendingRequests``: it inherits the book rather than holding one,
so that the per-append paths (``Connection.request``, ``_dispatch``, ``_answered``)
reach the book's dict and counters with no call in between.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final, final

import msgspec

from walsvc.core._errors import AppendOutcomeUnknown, BackendUnavailable, WALClosed, WALError

from ._client_messages import ClientMessage
from ._dial import NodeSocket

__all__ = ("MAX_PENDING", "MAX_PENDING_BYTES", "Pending", "PendingRequests")

_encode: Final = msgspec.msgpack.Encoder().encode
_decode: Final = msgspec.msgpack.Decoder(ClientMessage).decode
#: Requests (and their encoded bytes) a connection keeps waiting for answers before
#: callers wait for room.
MAX_PENDING: Final = 16384
MAX_PENDING_BYTES: Final = 64 * 1024 * 1024


@final
class Pending:
    """A request waiting for its answer: ``item``, the client message or its encoded
    bytes. ``sent`` once it reached a transport; ``resend``: safe to send again on a
    new socket (reads, idempotent appends), if the node there speaks at least protocol
    version ``resend_from``; ``resent``: how many times it was. ``since``: the newest
    timetick the connection had received an answer with when the request was made (an
    append of it lands with a later one)."""

    __slots__ = (
        "append",
        "future",
        "held",
        "item",
        "resend",
        "resend_from",
        "resent",
        "sent",
        "since",
        "size",
    )

    def __init__(
        self,
        future: asyncio.Future[Any],
        item: msgspec.Struct | bytes,
        append: bool,
        resend: bool,
        size: int = 0,
        resend_from: int = 1,
        since: int = 0,
    ) -> None:
        self.future = future
        self.since = since
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
        """Note that the request reached a transport (the node may act on it)."""
        self.sent = True

    def fail(self, reason: WALError, where: str) -> None:
        """Fail the request with ``reason``, unless it was answered. An append sent to
        the node at ``where`` fails ``AppendOutcomeUnknown`` instead (it may have
        landed), unless the connection was closed (``WALClosed``)."""
        if self.future.done():
            return
        if self.append and self.sent and not isinstance(reason, WALClosed):
            self.future.set_exception(
                AppendOutcomeUnknown(
                    f"the append was sent to {where} and the connection was lost"
                    f" before its answer ({reason})"
                )
            )
        else:
            self.future.set_exception(type(reason)(str(reason)))


class PendingRequests:
    """A connection's requests waiting for answers, by request id, and the error that
    ended the connection (see the module docstring). Built for ``Connection`` to
    subclass: it adds and sends requests, and dispatches their answers."""

    __slots__ = ("_lost", "_pending", "_pending_bytes", "_waiting_room")

    def __init__(self) -> None:
        self._pending: dict[int, Pending] = {}
        self._pending_bytes = 0
        self._waiting_room: deque[asyncio.Future[None]] = deque()
        #: The error that ended the connection; None while it lives.
        self._lost: WALError | None = None

    def check(self) -> None:
        """Raise the error that ended the connection, if it ended."""
        if self._lost is not None:
            raise type(self._lost)(str(self._lost))

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

    def _add(self, request: int, pending: Pending) -> None:
        """Put ``pending`` on the book as ``request`` (``Connection.request`` does the
        same inline: it runs per append)."""
        self._pending[request] = pending
        self._pending_bytes += pending.size

    def _answered(self, request: int) -> Pending | None:
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

    def _hold(self, request: int, pending: Pending) -> None:
        """Put ``pending``, refused by a draining node, back on the book as ``request``:
        it goes out on the next socket."""
        self._add(request, pending)
        pending.held = True

    def _keep_resendable(self, reason: str, where: str) -> None:
        """A socket to the node at ``where`` was lost (``reason``): take off the book
        what was answered, fail what may not be sent again, keep the rest."""
        for request, pending in list(self._pending.items()):
            if pending.future.done():
                self._answered(request)
            elif not (pending.resend or pending.held):
                self._answered(request)
                pending.fail(BackendUnavailable(reason), where)

    def _resend(self, socket: NodeSocket, handle: int, where: str) -> None:
        """Send what the book holds on the new ``socket`` to the node at ``where``, the
        WAL named by its new ``handle``; fail what needs a later protocol version than
        the node there speaks."""
        writer = socket.writer
        for request, pending in list(self._pending.items()):
            if pending.future.done():
                continue
            if pending.resend_from > socket.version and not pending.held:
                self._answered(request)
                pending.fail(
                    BackendUnavailable(
                        f"the node at {where} now speaks protocol version"
                        f" {socket.version}, which cannot take this request again"
                    ),
                    where,
                )
                continue
            if not pending.held:
                pending.resent += 1
            item = pending.item
            if isinstance(item, bytes):  # encoded by its caller: the message it encodes
                item = _decode(item)
            if hasattr(item, "wal"):
                item = pending.item = msgspec.structs.replace(item, wal=handle)
            writer.send(_encode(item), pending.mark_sent if pending.append else None)
            pending.held = False

    def _end(self, reason: WALError, where: str, *, final: bool = True) -> None:
        """The connection to the node at ``where`` ended with ``reason``: fail every
        request on the book, and let the callers waiting for room go on (their requests
        then raise ``reason``, if ``final``; else the connection takes requests again)."""
        if final and self._lost is None:
            self._lost = reason
        pending, self._pending = self._pending, {}
        self._pending_bytes = 0
        for entry in pending.values():
            entry.fail(reason, where)
        waiting, self._waiting_room = self._waiting_room, deque()
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)  # the caller's request then raises the loss
