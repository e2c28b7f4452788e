"""Transactions over walsvc://: ``RemoteWAL.begin_txn`` and ``resume_txn``.

The handle a client holds is ``walsvc.Txn`` itself, as for a local WAL: its checks
(vchannel, types, keys), its states, its replay of a keyed transaction that committed
earlier and its errors are one code path for both. Only where it sends its messages
differs: a local handle hands them to its WAL's interceptor chain, a remote one to
``_TxnWire``, which sends them to the node's handle of the same transaction
(``walsvc.service._txns``), named by its txn id. The node's interceptor chain owns the
transaction's state (keepalive, expiry, in-flight bodies), so its errors (``TxnExpired``,
``TxnAborted``, ``TxnNotActive``, ``UnknownTxn``) are the node's, by code.

Every request of a transaction appends to the log (BeginTxn, bodies, CommitTxn,
RollbackTxn). One whose connection is lost before its answer is resent on the next
connection (protocol version 2) and the node answers a resend it has served from the
first outcome (``walsvc.service._txns``): a begin carries a token, every later call its
handle's ``caller`` number and a ``seq``, so nothing is applied twice. Against a version
1 node, or with ``exactly_once=False``, such a request raises ``AppendOutcomeUnknown``
instead. The transaction lives on the node, not in the connection: a node restarted
in between forgot it (a resent call then raises ``AppendOutcomeUnknown``, not
``UnknownTxn``: a commit may have landed), and ``resume_txn(txn_id)`` takes one up from
another connection.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, final

from walsvc.core._errors import AppendOutcomeUnknown, InvalidArgument, InvalidMessage, UnknownTxn
from walsvc.core._message import AppendResult, Message, MessageType, TxnContext
from walsvc.write._txn import Txn, TxnReplay

from ._protocol import (
    Appended,
    Done,
    TxnAppend,
    TxnBegin,
    TxnBegun,
    TxnCommit,
    TxnResume,
    TxnRollback,
    WireMessage,
)

if TYPE_CHECKING:
    from ._client import RemoteWAL

__all__ = ("begin_remote_txn", "resume_remote_txn")


def _body(message: Message) -> WireMessage:
    # Txn checked it: a body message has no idempotency key of its own.
    return WireMessage(
        message.payload, message.vchannel, int(message.type), dict(message.properties), None
    )


#: The protocol version whose nodes answer resent transaction requests once.
_RESENDABLE_FROM = 2


@final
class _TxnWire:
    """Sends what a ``Txn`` appends to the node's handle of transaction ``txn_id``,
    numbering its calls (``caller``, ``seq``) so that a resend is answered, not applied
    again."""

    __slots__ = ("_begin", "_caller", "_seq", "_txn_id", "_wal")

    def __init__(self, wal: RemoteWAL, txn_id: int, begin: AppendResult) -> None:
        self._wal = wal
        self._txn_id = txn_id
        self._begin = begin
        self._caller = secrets.randbits(63) or 1
        self._seq = 0

    async def append(self, message: Message) -> AppendResult:
        """A body (``TxnAppend``), the CommitTxn (``TxnCommit``) or the RollbackTxn
        (``TxnRollback``) the handle built."""
        wal = self._wal
        wal._check_writable()
        conn = wal._conn
        request = conn.next_id()
        caller, seq = self._next()
        kind = message.type
        if kind is MessageType.COMMIT_TXN:
            item: TxnCommit | TxnRollback | TxnAppend = TxnCommit(
                request, wal._handle, self._txn_id, caller, seq
            )
        elif kind is MessageType.ROLLBACK_TXN:
            item = TxnRollback(request, wal._handle, self._txn_id, caller, seq)
        else:
            item = TxnAppend(request, wal._handle, self._txn_id, [_body(message)], caller, seq)
        answer: Appended | Done = await self._send(item, request, seq is not None)
        if isinstance(answer, Done):
            return self._begin  # a rollback: Txn.rollback ignores what its append returns
        return wal._result(answer.results[0])

    async def append_many(self, messages: list[Message]) -> list[AppendResult]:
        """A batch of bodies (one ``TxnAppend``), as ``Txn.append_many`` cuts them."""
        wal = self._wal
        wal._check_writable()
        conn = wal._conn
        request = conn.next_id()
        caller, seq = self._next()
        item = TxnAppend(
            request, wal._handle, self._txn_id, [_body(m) for m in messages], caller, seq
        )
        answer: Appended = await self._send(item, request, seq is not None)
        return [wal._result(r) for r in answer.results]

    def _next(self) -> tuple[int | None, int | None]:
        """The (caller, seq) of the next call, or (None, None) if it cannot be resent
        (a version 1 node, or exactly-once turned off)."""
        wal = self._wal
        if wal._keys is None or wal._conn.version < _RESENDABLE_FROM:
            return None, None
        self._seq += 1
        return self._caller, self._seq

    async def _send(
        self, item: TxnAppend | TxnCommit | TxnRollback, request: int, resend: bool
    ) -> Any:
        pending = self._wal._conn.request(
            item, request, append=True, resend=resend, resend_from=_RESENDABLE_FROM
        )
        try:
            return await pending.future
        except UnknownTxn as exc:
            if pending.resent:  # the node restarted and forgot it: it may have landed
                raise AppendOutcomeUnknown(
                    f"transaction {self._txn_id}'s call was resent to a node that no"
                    f" longer knows the transaction (restarted?): it may or may not have"
                    f" been applied ({exc})"
                ) from exc
            raise


def _handle(wal: RemoteWAL, begun: TxnBegun) -> Txn:
    """The client's handle of the node's transaction ``begun`` describes."""
    context = TxnContext(begun.txn_id, begun.keepalive_ms)
    begin = wal._result(begun.begin)
    wire = _TxnWire(wal, begun.txn_id, begin)
    if begun.replay_commit is not None:
        replay = TxnReplay(
            tuple(wal._result(r) for r in begun.replay_bodies or ()),
            wal._result(begun.replay_commit),
        )
        return Txn(
            wire.append,
            context,
            begun.vchannel,
            begin,
            idempotency_key=begun.idempotency_key,
            replay=replay,
        )
    return Txn(
        wire.append,
        context,
        begun.vchannel,
        begin,
        append_many=wire.append_many,
        idempotency_key=begun.idempotency_key,
    )


async def begin_remote_txn(
    wal: RemoteWAL, vchannel: str, keepalive: float, idempotency_key: str | None
) -> Txn:
    """``WAL.begin_txn`` on the node: the arguments checked here as a local WAL checks
    them (so nothing malformed is sent), the rest by the node."""
    wal._check_writable()
    if type(vchannel) is not str:
        raise InvalidMessage(f"vchannel must be str, not {type(vchannel).__name__}")
    if isinstance(keepalive, bool) or not isinstance(keepalive, int | float):
        raise InvalidArgument(f"keepalive must be a number of seconds, not {keepalive!r}")
    if not 0 < keepalive <= 86_400:
        raise InvalidArgument(f"keepalive must be in (0, 86400] seconds, not {keepalive!r}")
    if idempotency_key is not None:
        # The same checks as a keyed message's.
        Message(payload=b"", vchannel=vchannel, idempotency_key=idempotency_key)
    conn = wal._conn
    request = conn.next_id()
    resend = wal._keys is not None and conn.version >= _RESENDABLE_FROM
    token = secrets.token_urlsafe(16) if resend else None
    item = TxnBegin(request, wal._handle, vchannel, float(keepalive), idempotency_key, token)
    pending = conn.request(item, request, append=True, resend=resend, resend_from=_RESENDABLE_FROM)
    begun: TxnBegun = await pending.future
    return _handle(wal, begun)


async def resume_remote_txn(wal: RemoteWAL, txn_id: int) -> Txn:
    """``RemoteWAL.resume_txn`` (see there)."""
    wal._check_writable()
    if type(txn_id) is not int or txn_id < 0:
        raise InvalidArgument(f"txn_id must be an int >= 0, not {txn_id!r}")
    conn = wal._conn
    request = conn.next_id()
    item = TxnResume(request, wal._handle, txn_id)
    begun: TxnBegun = await conn.request(item, request, resend=True).future  # it changes nothing
    return _handle(wal, begun)
