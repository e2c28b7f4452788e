"""The transaction handle users hold: ``Txn``, from ``WAL.begin_txn`` or ``WAL.txn``.

A transaction is messages in the log: a BeginTxn, body messages carrying the txn context,
then a CommitTxn or RollbackTxn, all on one vchannel. The handle only builds those
messages and sends them through its WAL's interceptor chain; the transaction interceptor
(``interceptors.Transactions``) owns the state (keepalive, in-flight bodies, expiry).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Final, NamedTuple, final

from walsvc.core._errors import InvalidArgument, InvalidMessage, TxnError, TxnNotActive
from walsvc.core._message import AppendResult, Message, MessageType, TxnContext

__all__ = ("Txn", "TxnReplay", "TxnState")

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

    ``append`` (or ``append_many``, one batch down the chain) adds body messages (they are
    invisible to transaction-aware readers until commit); ``commit`` waits for in-flight
    body appends, then appends the CommitTxn and returns its result; ``rollback``
    discards the body. Each body append renews the keepalive; a transaction idle for
    longer than its keepalive (measured in timeticks) is rolled back by the WAL and then
    raises ``TxnExpired``. As an async context manager it commits on success and rolls
    back on error.

    A transaction begun with an ``idempotency_key`` whose earlier run committed is a
    *replay* (``replayed`` is True): it appends nothing; its body appends return the
    earlier run's body results in order, and ``commit`` returns the earlier commit's.
    """

    __slots__ = (
        "_append",
        "_append_many",
        "_ended_by",
        "_replay",
        "_replayed_count",
        "_state",
        "begin_result",
        "commit_result",
        "context",
        "idempotency_key",
        "vchannel",
    )

    def __init__(
        self,
        append: Callable[[Message], Awaitable[AppendResult]],
        context: TxnContext,
        vchannel: str,
        begin_result: AppendResult,
        *,
        append_many: Callable[[list[Message]], Awaitable[list[AppendResult]]] | None = None,
        idempotency_key: str | None = None,
        replay: TxnReplay | None = None,
    ) -> None:
        self._append = append
        self._append_many = append_many
        self._state = TxnState.OPEN
        self._ended_by: TxnError | None = None
        self._replay = replay
        self._replayed_count = 0
        #: The transaction's id and keepalive, carried by each of its messages.
        self.context = context
        #: The vchannel every message of the transaction goes to.
        self.vchannel = vchannel
        #: Where the BeginTxn landed.
        self.begin_result = begin_result
        #: Where the CommitTxn landed, once committed.
        self.commit_result: AppendResult | None = None
        #: The key that makes retries of this transaction exactly-once (None: none).
        self.idempotency_key = idempotency_key

    @property
    def txn_id(self) -> int:
        """The transaction's id, unique within the pchannel."""
        return self.context.txn_id

    @property
    def state(self) -> TxnState:
        """The handle's state as far as its own calls know (expiry shows on the next call)."""
        return self._state

    @property
    def replayed(self) -> bool:
        """True if an earlier run of this transaction (same idempotency key) committed:
        this handle appends nothing and answers with that run's results."""
        return self._replay is not None

    @property
    def replay(self) -> TxnReplay | None:
        """What a replay answers with (the earlier run's body and commit results), or
        None if this handle is not a replay (for a node handing the handle to a client)."""
        return self._replay

    def _check_open(self) -> None:
        if self._state is not TxnState.OPEN:
            if self._ended_by is not None:  # the WAL ended it: say how, every time
                raise type(self._ended_by)(str(self._ended_by))
            raise TxnNotActive(f"transaction {self.txn_id} is {self._state.value}")

    async def append(self, message: Message) -> AppendResult:
        """Append a body message; it must be for this transaction's vchannel and of a
        non-system, non-exclusive type, without an idempotency key (the transaction
        takes one: ``WAL.txn(vchannel, idempotency_key=...)``)."""
        self._check_open()
        body = self._body(message)
        if self._replay is not None:
            return self._replayed((message,))[0]
        try:
            return await self._append(body)
        except BaseException as exc:
            self._failed(exc)
            raise

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append body messages in order, in batches (one pass down the interceptor chain
        and one backend call each, instead of one per message); checked as ``append``
        checks them, all before any is appended."""
        self._check_open()
        bodies = [self._body(m) for m in messages]
        if self._replay is not None:
            return self._replayed(bodies)
        results: list[AppendResult] = []
        try:
            for batch in _batches(bodies):
                if self._append_many is None:
                    results += [await self._append(body) for body in batch]
                else:
                    results += await self._append_many(batch)
        except BaseException as exc:
            self._failed(exc)
            raise
        return results

    def _body(self, message: Message) -> Message:
        if not isinstance(message, Message):
            raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
        if message.vchannel != self.vchannel:
            raise InvalidMessage(
                f"transaction {self.txn_id} is on vchannel {self.vchannel!r}; the message is"
                f" for {message.vchannel!r}"
            )
        if message.type.is_system or message.type.is_exclusive:
            raise InvalidMessage(f"a {message.type.name} message cannot be part of a transaction")
        if message.idempotency_key is not None:
            raise InvalidMessage(
                "a transaction body message cannot carry an idempotency key of its own: give"
                " the transaction one (WAL.txn(vchannel, idempotency_key=...))"
            )
        if message.txn is not None:
            raise InvalidMessage("a transaction body message cannot carry a txn context")
        return Message(
            payload=message.payload,
            vchannel=message.vchannel,
            type=message.type,
            properties=message.properties,
            txn=self.context,
        )

    def _replayed(self, bodies: Sequence[Message]) -> list[AppendResult]:
        """The earlier run's results for the next ``len(bodies)`` body appends."""
        replay = self._replay
        assert replay is not None
        first = self._replayed_count
        if first + len(bodies) > len(replay.bodies):
            raise InvalidArgument(
                f"transaction {self.txn_id} (idempotency key {self.idempotency_key!r}) already"
                f" committed with {len(replay.bodies)} body messages; this retry appends more"
            )
        self._replayed_count += len(bodies)
        return list(replay.bodies[first : first + len(bodies)])

    async def commit(self) -> AppendResult:
        """Wait for in-flight body appends, append the CommitTxn, return its result."""
        self._check_open()
        if self._replay is not None:
            self._state = TxnState.COMMITTED
            self.commit_result = self._replay.commit
            return self._replay.commit
        self._state = TxnState.FAILED  # until the commit is known to have landed
        commit = Message(
            payload=_NO_PAYLOAD,
            vchannel=self.vchannel,
            type=MessageType.COMMIT_TXN,
            txn=self.context,
            idempotency_key=self.idempotency_key,
        )
        try:
            result = await self._append(commit)
        except BaseException as exc:
            self._failed(exc)
            raise
        self._state = TxnState.COMMITTED
        self.commit_result = result
        return result

    async def rollback(self) -> None:
        """Discard the transaction: append a RollbackTxn. Raises ``TxnNotActive`` if it
        already ended (``TxnExpired``/``TxnAborted`` if the WAL ended it), or if it is a
        replay (an earlier run committed: that cannot be undone)."""
        self._check_open()
        if self._replay is not None:
            self._state = TxnState.COMMITTED
            self.commit_result = self._replay.commit
            raise TxnNotActive(
                f"transaction {self.txn_id} (idempotency key {self.idempotency_key!r})"
                " committed in an earlier run; it cannot be rolled back"
            )
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
        replay = " replayed" if self._replay is not None else ""
        return f"<walsvc.Txn {self.txn_id} on {self.vchannel!r} {self._state.value}{replay}>"


@final
class TxnReplay(NamedTuple):
    """What a replayed transaction answers with: the results of the earlier run that
    committed, read from the log."""

    bodies: tuple[AppendResult, ...]
    commit: AppendResult


#: A batch of ``Txn.append_many`` holds at most this many messages and about this many
#: payload bytes: it is encoded in one synchronous step.
_BATCH_MESSAGES: Final = 1024
_BATCH_BYTES: Final = 4 << 20


def _batches(bodies: list[Message]) -> Iterator[list[Message]]:
    batch: list[Message] = []
    size = 0
    for body in bodies:
        if batch and (len(batch) == _BATCH_MESSAGES or size + len(body.payload) > _BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(body)
        size += len(body.payload)
    if batch:
        yield batch
