"""The transaction handle users hold: ``Txn``, from ``WAL.begin_txn`` or ``WAL.txn``.

A transaction is messages in the log: a BeginTxn, body messages carrying the txn context,
then a CommitTxn or RollbackTxn, all on one vchannel. The handle only builds those
messages and sends them through its WAL's interceptor chain; the transaction interceptor
(``interceptors.Transactions``) owns the state (keepalive, in-flight bodies, expiry).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final, final

from ._errors import InvalidMessage, TxnError, TxnNotActive
from ._message import AppendResult, Message, MessageType, TxnContext

__all__ = ("Txn", "TxnState")

_NO_PAYLOAD: Final = b""


class TxnState(enum.Enum):
    """Where a transaction handle is: open for appends, or ended one way or another."""

    OPEN = "open"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    FAILED = "failed"  # expired, aborted, or its commit failed


@final
class Txn:
    """An open transaction on one vchannel.

    ``append`` adds body messages (they are invisible to transaction-aware readers until
    commit); ``commit`` waits for in-flight body appends, then appends the CommitTxn and
    returns its result; ``rollback`` discards the body. Each body append renews the
    keepalive; a transaction idle for longer than its keepalive (measured in timeticks)
    is rolled back by the WAL and then raises ``TxnExpired``. As an async context
    manager it commits on success and rolls back on error.
    """

    __slots__ = (
        "_append",
        "_ended_by",
        "_state",
        "begin_result",
        "commit_result",
        "context",
        "vchannel",
    )

    def __init__(
        self,
        append: Callable[[Message], Awaitable[AppendResult]],
        context: TxnContext,
        vchannel: str,
        begin_result: AppendResult,
    ) -> None:
        self._append = append
        self._state = TxnState.OPEN
        self._ended_by: TxnError | None = None
        #: The transaction's id and keepalive, carried by each of its messages.
        self.context = context
        #: The vchannel every message of the transaction goes to.
        self.vchannel = vchannel
        #: Where the BeginTxn landed.
        self.begin_result = begin_result
        #: Where the CommitTxn landed, once committed.
        self.commit_result: AppendResult | None = None

    @property
    def txn_id(self) -> int:
        """The transaction's id, unique within the pchannel."""
        return self.context.txn_id

    @property
    def state(self) -> TxnState:
        """The handle's state as far as its own calls know (expiry shows on the next call)."""
        return self._state

    def _check_open(self) -> None:
        if self._state is not TxnState.OPEN:
            if self._ended_by is not None:  # the WAL ended it: say how, every time
                raise type(self._ended_by)(str(self._ended_by))
            raise TxnNotActive(f"transaction {self.txn_id} is {self._state.value}")

    async def append(self, message: Message) -> AppendResult:
        """Append a body message; it must be for this transaction's vchannel and of a
        non-system, non-exclusive type, without an idempotency key."""
        self._check_open()
        if not isinstance(message, Message):
            raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
        if message.vchannel != self.vchannel:
            raise InvalidMessage(
                f"transaction {self.txn_id} is on vchannel {self.vchannel!r}; the message is"
                f" for {message.vchannel!r}"
            )
        if message.type.is_system or message.type.is_exclusive:
            raise InvalidMessage(f"a {message.type.name} message cannot be part of a transaction")
        if message.txn is not None or message.idempotency_key is not None:
            raise InvalidMessage(
                "a transaction body message carries neither a txn context nor an idempotency"
                " key of its own"
            )
        body = Message(
            payload=message.payload,
            vchannel=message.vchannel,
            type=message.type,
            properties=message.properties,
            txn=self.context,
        )
        try:
            return await self._append(body)
        except BaseException as exc:
            self._failed(exc)
            raise

    async def commit(self) -> AppendResult:
        """Wait for in-flight body appends, append the CommitTxn, return its result."""
        self._check_open()
        self._state = TxnState.FAILED  # until the commit is known to have landed
        try:
            result = await self._append(self._control(MessageType.COMMIT_TXN))
        except BaseException as exc:
            self._failed(exc)
            raise
        self._state = TxnState.COMMITTED
        self.commit_result = result
        return result

    async def rollback(self) -> None:
        """Discard the transaction: append a RollbackTxn. Raises ``TxnNotActive`` if it
        already ended (``TxnExpired``/``TxnAborted`` if the WAL ended it)."""
        self._check_open()
        self._state = TxnState.ROLLED_BACK
        try:
            await self._append(self._control(MessageType.ROLLBACK_TXN))
        except BaseException as exc:
            self._failed(exc)
            raise

    def _control(self, type_: MessageType) -> Message:
        return Message(payload=_NO_PAYLOAD, vchannel=self.vchannel, type=type_, txn=self.context)

    def _failed(self, exc: BaseException) -> None:
        # A failed append ends the transaction (the interceptor rolls it back).
        self._state = TxnState.FAILED
        if isinstance(exc, TxnError) and self._ended_by is None:
            self._ended_by = exc

    async def __aenter__(self) -> Txn:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            if self._state is TxnState.OPEN:
                await self.commit()
            return
        if self._state is TxnState.OPEN:
            try:
                await self.rollback()
            except Exception as rollback_error:  # the original error is the one to see
                if exc is not None:
                    exc.add_note(
                        f"rolling back transaction {self.txn_id} failed too: {rollback_error!r}"
                    )

    def __repr__(self) -> str:
        return f"<walsvc.Txn {self.txn_id} on {self.vchannel!r} {self._state.value}>"
