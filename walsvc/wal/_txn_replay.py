"""Reading back a committed transaction for a keyed retry (``WAL.begin_txn`` with an
``idempotency_key`` whose transaction committed): its BeginTxn and body results, from
the log, so the replayed handle answers as the first run did."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import CorruptRecord, WALClosed, WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, MessageType, TxnContext
from walsvc.read._scanner import Scanner
from walsvc.write._txn import TxnReplay

__all__ = ("CommittedTxn", "read_committed_txn")

#: ``WAL.read`` with ``raw=True``: a scanner from a policy through some filters.
RawRead = Callable[[DeliverPolicy, Iterable[Filter]], Scanner]


class CommittedTxn(NamedTuple):
    """A committed transaction as the log holds it: its context, its BeginTxn's result,
    and the replay (body results and commit result) a retried handle answers with."""

    context: TxnContext
    begin: AppendResult
    replay: TxnReplay


async def read_committed_txn(
    read: RawRead, vchannel: str, key: str, committed: AppendResult
) -> CommittedTxn:
    """The transaction on ``vchannel`` whose CommitTxn was appended as ``committed``,
    read back from the log: from the commit's last-confirmed id (at or before its
    BeginTxn) to the commit. Raises ``WALTruncated`` if its BeginTxn is no longer in the
    log, ``CorruptRecord`` if ``committed`` names no CommitTxn."""
    commit_id = committed.message_id
    commit = await _message_at(read, commit_id)
    if commit.txn is None:
        raise CorruptRecord(f"{commit_id!r} holds no transaction's CommitTxn")
    start = commit.last_confirmed_id
    deliver = DeliverPolicy.all() if start is None else DeliverPolicy.start_from(start)
    begin: AppendResult | None = None
    bodies: list[AppendResult] = []
    async with read(deliver, [Filter(vchannels=(vchannel,))]) as scanner:
        async for message in scanner:
            if message.txn == commit.txn and message.persisted:
                result = AppendResult(
                    message.message_id, message.timetick, message.last_confirmed_id
                )
                if message.type is MessageType.BEGIN_TXN:
                    begin = result
                elif not message.type.is_system:
                    bodies.append(result)
            if not message.message_id < commit_id:
                break
    if begin is None:
        raise WALTruncated(
            f"transaction {commit.txn.txn_id} (idempotency key {key!r}) committed as"
            f" {commit_id!r}, but its BeginTxn is no longer in the log to replay it from"
        )
    return CommittedTxn(commit.txn, begin, TxnReplay(tuple(bodies), committed))


async def _message_at(read: RawRead, message_id: MessageId) -> ImmutableMessage:
    """The persisted message stored as ``message_id``."""
    async with read(DeliverPolicy.start_from(message_id), ()) as scanner:
        async for message in scanner:
            if message.persisted:
                return message
    raise WALClosed("the WAL closed while a committed transaction was read back")
