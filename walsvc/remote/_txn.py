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
RollbackTxn): one whose connection is lost before its answer raises
``AppendOutcomeUnknown`` and is never resent. The transaction lives on the node, not in
the connection: ``resume_txn(txn_id)`` takes it up again from a new one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from walsvc.core._errors import InvalidArgument, InvalidMessage
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


@final
class _TxnWire:
    """Sends what a ``Txn`` appends to the node's handle of transaction ``txn_id``."""

    __slots__ = ("_begin", "_txn_id", "_wal")

    def __init__(self, wal: RemoteWAL, txn_id: int, begin: AppendResult) -> None:
        self._wal = wal
        self._txn_id = txn_id
        self._begin = begin

    async def append(self, message: Message) -> AppendResult:
        """A body (``TxnAppend``), the CommitTxn (``TxnCommit``) or the RollbackTxn
        (``TxnRollback``) the handle built."""
        wal = self._wal
        wal._check_writable()
        conn = wal._conn
        request = conn.next_id()
        kind = message.type
        if kind is MessageType.COMMIT_TXN:
            item: TxnCommit | TxnRollback | TxnAppend = TxnCommit(
                request, wal._handle, self._txn_id
            )
        elif kind is MessageType.ROLLBACK_TXN:
            item = TxnRollback(request, wal._handle, self._txn_id)
        else:
            item = TxnAppend(request, wal._handle, self._txn_id, [_body(message)])
        answer: Appended | Done = await conn.request(item, request, append=True).future
        if isinstance(answer, Done):
            return self._begin  # a rollback: Txn.rollback ignores what its append returns
        return wal._result(answer.results[0])

    async def append_many(self, messages: list[Message]) -> list[AppendResult]:
        """A batch of bodies (one ``TxnAppend``), as ``Txn.append_many`` cuts them."""
        wal = self._wal
        wal._check_writable()
        conn = wal._conn
        request = conn.next_id()
        item = TxnAppend(request, wal._handle, self._txn_id, [_body(m) for m in messages])
        answer: Appended = await conn.request(item, request, append=True).future
        return [wal._result(r) for r in answer.results]


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
    item = TxnBegin(request, wal._handle, vchannel, float(keepalive), idempotency_key)
    begun: TxnBegun = await conn.request(item, request, append=True).future
    return _handle(wal, begun)


async def resume_remote_txn(wal: RemoteWAL, txn_id: int) -> Txn:
    """``RemoteWAL.resume_txn`` (see there)."""
    wal._check_writable()
    if type(txn_id) is not int or txn_id < 0:
        raise InvalidArgument(f"txn_id must be an int >= 0, not {txn_id!r}")
    conn = wal._conn
    request = conn.next_id()
    begun: TxnBegun = await conn.request(TxnResume(request, wal._handle, txn_id), request).future
    return _handle(wal, begun)
