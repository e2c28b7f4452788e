"""Transactions: the session state behind ``walsvc.Txn``.

A transaction is BeginTxn, body messages carrying its ``TxnContext``, then CommitTxn or
RollbackTxn, on one vchannel. This interceptor checks every transaction message against
its session (unknown id, ended, expired), counts in-flight body appends so a commit waits
for them, renews the keepalive with each body append, rolls back transactions whose
keepalive ran out (measured in timeticks: a transaction expires once the WAL allocates a
tick later than its last body tick plus the keepalive), and pins the WAL's last-confirmed
id at the BeginTxn so a reader resuming from any message appended while the transaction
is open also reads its begin and body (the path Milvus issue #45088 got wrong).
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar, final

from walsvc.core._chain import AppendBatchNext, AppendNext, InterceptorContext
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    TxnAborted,
    TxnError,
    TxnExpired,
    TxnNotActive,
    UnknownTxn,
    WALError,
    WALTruncated,
)
from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, Message, MessageType, TxnContext
from walsvc.core._timetick import span_of_ms

from ._reading import read_through

__all__ = ("Transactions",)

_R = TypeVar("_R", AppendResult, list[AppendResult])
_ENDED_MEMORY: Final = 65_536  # how many ended transactions still get a precise error


class _State(enum.Enum):
    BEGIN = "beginning"
    OPEN = "open"
    COMMITTING = "committing"
    ROLLING_BACK = "rolling back"


@final
class _Session:
    __slots__ = (
        "begin_id",
        "context",
        "drained",
        "expires_at",
        "in_flight",
        "pin",
        "state",
        "vchannel",
    )

    def __init__(self, context: TxnContext, vchannel: str, pin: object) -> None:
        self.context = context
        self.vchannel = vchannel
        self.pin = pin
        self.begin_id: MessageId | None = None
        self.state = _State.BEGIN
        self.expires_at = 0
        self.in_flight = 0
        self.drained: asyncio.Event | None = None

    def renew(self, tick: int) -> None:
        self.expires_at = max(self.expires_at, tick + span_of_ms(self.context.keepalive_ms))


@final
class Transactions:
    """The transaction interceptor (required by ``WAL.begin_txn``)."""

    #: Marks the chain member ``WAL.begin_txn`` relies on.
    manages_transactions: Final = True
    #: Messages without a transaction context pass straight through (see ``walsvc.core._chain``).
    passes_plain_messages: Final = True

    __slots__ = (
        "_context",
        "_ended",
        "_expiring",
        "_listening",
        "_sessions",
        "begun",
        "ended",
        "rolled_back_on_open",
    )

    def __init__(self) -> None:
        self._context: InterceptorContext | None = None
        #: How many transactions of earlier writers ``ready`` found open and rolled back.
        self.rolled_back_on_open = 0
        #: Transactions begun (BeginTxn appends tried) and ended, by how: "committed",
        #: "rolled_back" (by the user or by walsvc), "expired", "unresolved" (a commit
        #: whose outcome could not be read). Begun less ended is those open.
        self.begun = 0
        self.ended = {"committed": 0, "rolled_back": 0, "expired": 0, "unresolved": 0}
        self._sessions: dict[int, _Session] = {}
        self._ended: OrderedDict[int, TxnError] = OrderedDict()
        self._expiring: set[asyncio.Task[None]] = set()
        self._listening = False

    @property
    def open_count(self) -> int:
        """How many transactions are open."""
        return len(self._sessions)

    async def ready(self, context: InterceptorContext) -> None:
        """Bind to the WAL and roll back the transactions an earlier writer left open."""
        if self._context is not None and self._context is not context:
            raise RuntimeError("a Transactions interceptor serves one WAL")
        self._context = context
        left_open = await _left_open(context)
        for txn, vchannel in left_open:
            self._ended[txn.txn_id] = TxnAborted(
                f"transaction {txn.txn_id}: the writer that began it stopped; rolled back"
            )
            await context.append_system(_rollback_of(txn, vchannel))
            self.rolled_back_on_open += 1

    def do_append(self, message: Message, call_next: AppendNext) -> Awaitable[AppendResult]:
        """Check transaction messages against their session; pass others through."""
        txn = message.txn
        if txn is None:
            return call_next(message)
        return self._transactional(message, txn, call_next)

    async def _transactional(
        self, message: Message, txn: TxnContext, call_next: AppendNext
    ) -> AppendResult:
        kind = message.type
        if kind is MessageType.BEGIN_TXN:
            return await self._begin(message, txn, call_next)
        session = self._session(txn, message.vchannel)
        if kind is MessageType.COMMIT_TXN:
            return await self._commit(session, message, call_next)
        if kind is MessageType.ROLLBACK_TXN:
            return await self._rollback(session, message, call_next)
        return await self._body(session, lambda: call_next(message))

    def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Awaitable[list[AppendResult]]:
        """A batch of one transaction's bodies (``Txn.append_many``) is checked and counted
        as its bodies are one by one; any other batch holds no transaction message
        (``WAL.append_many`` refuses them) and passes through."""
        txn = messages[0].txn if messages else None
        if txn is None:
            return call_next(messages)
        session = self._session(txn, messages[0].vchannel)
        return self._body(session, lambda: call_next(messages))

    def _bound(self) -> InterceptorContext:
        assert self._context is not None, "appends wait for ready()"
        return self._context

    def _session(self, txn: TxnContext, vchannel: str) -> _Session:
        session = self._sessions.get(txn.txn_id)
        if session is None:
            ended = self._ended.get(txn.txn_id)
            if ended is not None:
                raise type(ended)(str(ended))
            raise UnknownTxn(f"transaction {txn.txn_id} is not open on this WAL")
        if session.context != txn or session.vchannel != vchannel:
            raise UnknownTxn(f"the message does not match transaction {txn.txn_id}")
        context = self._bound()
        if session.state is _State.OPEN and context.last_tick() > session.expires_at:
            self._expire(session)
            ended = self._ended[txn.txn_id]
            raise type(ended)(str(ended))
        return session

    async def _begin(
        self, message: Message, txn: TxnContext, call_next: AppendNext
    ) -> AppendResult:
        context = self._bound()
        if txn.txn_id in self._sessions or txn.txn_id in self._ended:
            raise UnknownTxn(f"transaction {txn.txn_id} was already begun")
        session = _Session(txn, message.vchannel, context.pin_last_confirmed())
        self._sessions[txn.txn_id] = session
        self.begun += 1
        try:
            result = await call_next(message)
        except BaseException:
            self._end(session, TxnAborted(f"transaction {txn.txn_id}: its BeginTxn failed"))
            raise
        session.begin_id = result.message_id
        if session.state is _State.BEGIN:  # not aborted meanwhile
            session.state = _State.OPEN
            session.renew(result.timetick)
            self._listen()
        return result

    async def _body(self, session: _Session, append: Callable[[], Awaitable[_R]]) -> _R:
        """Append one body message or a batch of them (``append``) for ``session``."""
        if session.state is not _State.OPEN:
            raise TxnNotActive(f"transaction {session.context.txn_id} is {session.state.value}")
        session.in_flight += 1
        try:
            result = await append()
        except BaseException as exc:
            if session.pin is not None:  # open or committing: the body has a hole now
                self._abort_in_background(
                    session,
                    TxnAborted(
                        f"transaction {session.context.txn_id}: a body append failed"
                        f" ({exc!r}); the transaction was rolled back"
                    ),
                )
            raise
        finally:
            session.in_flight -= 1
            if session.in_flight == 0 and session.drained is not None:
                session.drained.set()
        last = result[-1] if isinstance(result, list) else result
        session.renew(last.timetick)
        return result

    async def _commit(
        self, session: _Session, message: Message, call_next: AppendNext
    ) -> AppendResult:
        txn_id = session.context.txn_id
        if session.state is not _State.OPEN:
            raise TxnNotActive(f"transaction {txn_id} is {session.state.value}")
        session.state = _State.COMMITTING
        if session.in_flight:
            session.drained = asyncio.Event()
            await session.drained.wait()
        if session.pin is None:  # aborted while its last bodies finished
            ended = self._ended[txn_id]
            raise type(ended)(str(ended))
        try:
            result = await call_next(message)
        except AppendOutcomeUnknown:
            # The CommitTxn may be in the log: read it before saying anything.
            return await self._resolve_commit(session)
        except BaseException as exc:
            self._end(session, TxnAborted(f"transaction {txn_id}: its commit failed ({exc!r})"))
            raise
        self._end(session, TxnNotActive(f"transaction {txn_id} is committed"), how="committed")
        return result

    async def _resolve_commit(self, session: _Session) -> AppendResult:
        """After an ambiguous commit: the CommitTxn's result if the log has it; otherwise
        roll back and raise ``TxnAborted``; if the log cannot be read, end the session
        and raise ``AppendOutcomeUnknown`` (readers see whichever end the log holds)."""
        txn_id = session.context.txn_id
        try:
            found = await _find_end(self._bound(), session)
        except WALError as exc:
            self._end(
                session,
                TxnNotActive(f"transaction {txn_id}: its commit is unresolved"),
                how="unresolved",
            )
            raise AppendOutcomeUnknown(
                f"transaction {txn_id}: the commit may or may not be in the log, and the log"
                f" could not be read to tell ({exc!r})"
            ) from exc
        if found is not None and found.type is MessageType.COMMIT_TXN:
            self._end(session, TxnNotActive(f"transaction {txn_id} is committed"), how="committed")
            return AppendResult(found.message_id, found.timetick, found.last_confirmed_id)
        error = TxnAborted(f"transaction {txn_id}: its commit was not written; rolled back")
        await self._abort(session, error)
        raise error

    async def _rollback(
        self, session: _Session, message: Message, call_next: AppendNext
    ) -> AppendResult:
        txn_id = session.context.txn_id
        if session.state is not _State.OPEN:
            raise TxnNotActive(f"transaction {txn_id} is {session.state.value}")
        session.state = _State.ROLLING_BACK
        try:
            return await call_next(message)
        finally:
            self._end(session, TxnNotActive(f"transaction {txn_id} is rolled back"))

    # -- ending transactions the WAL decides to end -----------------------------------

    async def abort_vchannel(self, vchannel: str, reason: str) -> None:
        """Roll back every open transaction on ``vchannel`` (an exclusive message is about
        to be appended there) and wait until their RollbackTxns are durable. The broadcast
        vchannel "" reaches every vchannel: for it, every open transaction is rolled back,
        and broadcast transactions are rolled back for any vchannel."""
        doomed = [
            s
            for s in self._sessions.values()
            if s.state is _State.OPEN and (s.vchannel == vchannel or "" in (vchannel, s.vchannel))
        ]
        for session in doomed:
            await self._abort(
                session, TxnAborted(f"transaction {session.context.txn_id}: {reason}")
            )

    def _expire(self, session: _Session) -> None:
        txn_id = session.context.txn_id
        self._abort_in_background(
            session,
            TxnExpired(
                f"transaction {txn_id} expired: no body append within its keepalive of"
                f" {session.context.keepalive_ms} ms; it was rolled back"
            ),
        )

    def _abort_in_background(self, session: _Session, error: TxnError) -> None:
        """End ``session`` now; append its RollbackTxn in the background."""
        pin = self._end(session, error, keep_pin=True)
        if pin is None:
            return
        task = asyncio.ensure_future(self._write_rollback(session, pin))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    async def _abort(self, session: _Session, error: TxnError) -> None:
        """End ``session`` now and wait until its RollbackTxn is written."""
        pin = self._end(session, error, keep_pin=True)
        if pin is not None:
            await self._write_rollback(session, pin)

    async def _write_rollback(self, session: _Session, pin: object) -> None:
        """Append the RollbackTxn of an ended ``session``, then release its ``pin``: until
        the RollbackTxn is in the log the transaction is open there, so a message appended
        meanwhile must still name a last-confirmed id at or before its BeginTxn. Best
        effort: if the WAL cannot write, readers drop the body once its keepalive runs
        out."""
        context = self._bound()
        try:
            await context.append_system(_rollback_of(session.context, session.vchannel))
        except WALError:
            pass
        finally:
            context.unpin(pin)

    def _end(
        self,
        session: _Session,
        error: TxnError,
        *,
        keep_pin: bool = False,
        how: str = "rolled_back",
    ) -> object | None:
        """End ``session`` with ``error`` (what its later calls raise), counted in
        ``ended`` as ``how`` ("expired" for a ``TxnExpired``). Returns the session's
        last-confirmed pin if ``keep_pin`` (the caller releases it once the
        transaction's end is in the log), else releases it; returns None if the session
        had already ended."""
        txn_id = session.context.txn_id
        pin = session.pin
        if pin is None:
            return None
        how = "expired" if isinstance(error, TxnExpired) else how
        self.ended[how] += 1
        if not keep_pin:
            self._bound().unpin(pin)
        session.pin = None
        self._sessions.pop(txn_id, None)
        self._ended[txn_id] = error
        if len(self._ended) > _ENDED_MEMORY:
            self._ended.popitem(last=False)
        if session.drained is not None:
            session.drained.set()
        if not self._sessions:
            self._unlisten()
        return pin if keep_pin else None

    # -- expiry by timetick -----------------------------------------------------------

    def _listen(self) -> None:
        if not self._listening:
            self._listening = True
            self._bound().add_tick_listener(self._on_tick)

    def _unlisten(self) -> None:
        if self._listening:
            self._listening = False
            self._bound().remove_tick_listener(self._on_tick)

    def _on_tick(self, tick: int) -> None:
        for session in list(self._sessions.values()):
            if session.state is _State.OPEN and tick > session.expires_at:
                self._expire(session)

    async def aclose(self) -> None:
        """End every open transaction (``TxnAborted``) without writing, and wait for
        rollbacks being written."""
        for session in list(self._sessions.values()):
            self._end(session, TxnAborted(f"transaction {session.context.txn_id}: the WAL closed"))
        if self._expiring:
            await asyncio.gather(*self._expiring, return_exceptions=True)


async def _find_end(context: InterceptorContext, session: _Session) -> ImmutableMessage | None:
    """The CommitTxn or RollbackTxn of ``session`` in the log (read from its BeginTxn
    through the newest message), or None."""
    latest = await context.latest_message_id()
    if latest is None or session.begin_id is None:
        return None
    start = DeliverPolicy.start_from(session.begin_id)
    async for message in read_through(context, start, latest):
        if message.txn == session.context and message.type in _ENDS:
            return message
    return None


def _rollback_of(txn: TxnContext, vchannel: str) -> Message:
    return Message(payload=b"", vchannel=vchannel, type=MessageType.ROLLBACK_TXN, txn=txn)


_ENDS: Final = frozenset({MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})


async def _left_open(context: InterceptorContext) -> list[tuple[TxnContext, str]]:
    """The transactions begun in the log but neither committed nor rolled back, in begin
    order, with their vchannels. Every one began at or after the last-confirmed id of the
    newest message (the WAL holds that id while its interceptors recover), so only the
    log from there is read (all of what is retained, if that id was truncated)."""
    latest = await context.latest_message_id()
    if latest is None:
        return []
    start = context.last_confirmed_id()
    if start is not None:
        try:
            return await _scan_for_open(context, DeliverPolicy.start_from(start), latest)
        except WALTruncated:
            pass
    return await _scan_for_open(context, DeliverPolicy.all(), latest)


async def _scan_for_open(
    context: InterceptorContext, deliver: DeliverPolicy, latest: MessageId
) -> list[tuple[TxnContext, str]]:
    open_txns: dict[int, tuple[TxnContext, str]] = {}
    async for message in read_through(context, deliver, latest):
        txn = message.txn
        if txn is None:
            continue
        if message.type is MessageType.BEGIN_TXN:
            open_txns[txn.txn_id] = (txn, message.vchannel)
        elif message.type in _ENDS:
            open_txns.pop(txn.txn_id, None)
    return list(open_txns.values())
