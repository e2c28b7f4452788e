"""The append interceptor chain: the Protocols an interceptor implements, the context the
WAL gives it, and how a chain of them is composed around the WAL's serialization point.

An interceptor sees every append of its WAL as a ``Message`` and a ``call_next`` that
runs the rest of the chain; the innermost ``call_next`` is the WAL's serialization point
(timetick, last-confirmed id, envelope, backend). The first interceptor of a chain is the
outermost. An interceptor may rewrite the message, short-circuit (answer without calling
``call_next``), call ``call_next`` again (redo) or only observe; it must never fail an
append after ``call_next`` returned successfully, because the message is then in the log.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import Final, Protocol, TypeAlias, runtime_checkable

from . import _compiled
from ._deliver import DeliverPolicy
from ._filter import Filter
from ._ids import MessageId
from ._message import SYSTEM_TYPES, AppendResult, ImmutableMessage, Message

__all__ = (
    "KEYED_BATCH",
    "PARTLY_KEYED_BATCH",
    "PLAIN_BATCH",
    "UNCHECKED_BATCH",
    "AppendBatchNext",
    "AppendNext",
    "BatchInterceptor",
    "ChainMember",
    "ClosingInterceptor",
    "CoalescingInterceptor",
    "Interceptor",
    "InterceptorContext",
    "KeyRecall",
    "ManagesTransactions",
    "PassesPlainMessages",
    "PlainAdmission",
    "ReadyInterceptor",
    "StoppingInterceptor",
    "TickListener",
    "TxnKeyWindow",
    "build_batch_chain",
    "build_chain",
    "coalescing_head",
    "is_plain",
    "manages_transactions",
    "passes_plain_messages",
    "plain_admitters",
    "user_batch_kind",
)


class AppendNext(Protocol):
    """The rest of the chain below an interceptor: appends one message."""

    def __call__(self, message: Message, /) -> Awaitable[AppendResult]: ...


class AppendBatchNext(Protocol):
    """The rest of the chain for a batch: appends messages contiguously, in order."""

    def __call__(self, messages: Sequence[Message], /) -> Awaitable[list[AppendResult]]: ...


#: Called with every timetick the WAL's timetick sync produces (persisted or idle).
TickListener: TypeAlias = Callable[[int], None]


@runtime_checkable
class Interceptor(Protocol):
    """Sees every append (``WAL.append``, transaction messages) of one WAL."""

    def do_append(self, message: Message, call_next: AppendNext) -> Awaitable[AppendResult]:
        """Append ``message`` by calling ``call_next`` (or answer without it).

        Usually an ``async def``; an interceptor with nothing to do for a message may be
        a plain method that returns ``call_next(message)`` unawaited, which costs the
        append one call instead of a coroutine frame. An interceptor that passes every
        plain message through (no idempotency key, no txn: see ``is_plain``) can say so
        with a class attribute ``passes_plain_messages = True``; the WAL then does not
        call it for them at all.
        """
        ...


@runtime_checkable
class PassesPlainMessages(Protocol):
    """Optional capability: ``passes_plain_messages = True`` (a class attribute) says the
    interceptor's ``do_append`` passes every plain message (see ``is_plain``) straight to
    ``call_next``; the WAL then does not call it for them at all."""

    passes_plain_messages: bool


@runtime_checkable
class ManagesTransactions(Protocol):
    """Optional capability: ``manages_transactions = True`` says the interceptor runs
    transactions (BeginTxn, bodies, CommitTxn and RollbackTxn, as
    ``interceptors.Transactions`` does); ``WAL.begin_txn`` needs one in the chain."""

    manages_transactions: bool


@runtime_checkable
class BatchInterceptor(Protocol):
    """Optional: handles ``WAL.append_many`` batches as a whole. If any interceptor of a
    chain lacks it, ``append_many`` appends the messages one at a time through
    ``do_append`` (in order, but not necessarily contiguously)."""

    def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Awaitable[list[AppendResult]]:
        """Append ``messages`` in order by calling ``call_next`` (or otherwise); may pass
        ``call_next(messages)`` through unawaited, as ``do_append`` may."""
        ...


@runtime_checkable
class CoalescingInterceptor(Protocol):
    """Optional: takes the concurrent single appends of messages that are not plain (see
    ``is_plain``: keyed messages, for ``Dedup``) as one batch, each answered on its own.

    The WAL uses it when the interceptor is the outermost one of its chain, every member
    below it handles batches and the backend's acks take time: it gathers the appends of
    such messages started within one loop iteration (``walsvc.write._coalesce``) and
    calls ``do_append_coalesced`` with them once, in a task of its own that no caller's
    cancellation reaches and that runs to its end (the WAL's close waits for it). A
    caller cancelled before the call leaves its message out of it.
    """

    def do_append_coalesced(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Awaitable[Sequence[AppendResult | Exception | None]]:
        """Append ``messages``, of independent callers (nothing orders them), through
        ``call_next`` (the rest of the chain for a batch: contiguous, in order) or
        otherwise; return one outcome per message: its result, the error its caller gets,
        or None, which has the WAL append that message on its own, through
        ``do_append`` (for one that must wait for something, say)."""
        ...


@runtime_checkable
class PlainAdmission(Protocol):
    """Optional: lets a plain message (see ``is_plain``) appended on its own skip the
    interceptor's ``do_append`` when all it does there is synchronous bookkeeping around
    the append (``ExclusiveLock`` counting the appends in flight per vchannel).

    The WAL asks ``admit_plain(message)`` instead of calling ``do_append``. True: the
    interceptor took the message as ``do_append`` would have before its ``call_next``,
    and gets ``release_plain(message)`` once the append has finished, whatever its
    outcome. False: it took nothing, and the message goes down the whole plain chain
    through ``do_append`` (to wait for something, say). The WAL uses this only when every
    interceptor of its plain chain implements it, and only for appends it does not batch
    (a batch, coalesced or from ``append_many``, takes the batch chain).
    """

    def admit_plain(self, message: Message) -> bool:
        """Take ``message`` without an ``await``, or return False to see it in
        ``do_append``."""
        ...

    def release_plain(self, message: Message) -> None:
        """The append of a message ``admit_plain`` took has finished."""
        ...


@runtime_checkable
class ReadyInterceptor(Protocol):
    """Optional: recovers state before the first append. The WAL runs every ``ready`` in
    chain order, in the background, as soon as it opens; appends wait for all of them,
    reads do not. If one fails transiently (a retriable error, ``AppendOutcomeUnknown``)
    the next append calls it again with the same context, so a hook must allow that;
    if one fails otherwise, every append raises its error."""

    async def ready(self, context: InterceptorContext) -> None:
        """Bind to the WAL and recover state (e.g. from the log); called again with the
        same context after it failed transiently."""
        ...


@runtime_checkable
class ClosingInterceptor(Protocol):
    """Optional: released when the WAL closes, after the last append finished."""

    async def aclose(self) -> None:
        """Stop background work and release resources. Called once."""
        ...


@runtime_checkable
class StoppingInterceptor(Protocol):
    """Optional: told the moment the WAL begins to close, before it lets the appends it
    queued finish. Background work that appends wait for (a recovery reading the log)
    must stop here, and the appends waiting for it fail with ``WALClosed``: a read that
    never returns would otherwise hold the close for good."""

    def begin_close(self) -> None:
        """Stop the background work appends wait for. Called once, before ``aclose``."""
        ...


@runtime_checkable
class TxnKeyWindow(Protocol):
    """Optional: remembers the idempotency keys of committed transactions (``Dedup``).
    ``WAL.begin_txn(..., idempotency_key=k)`` asks it first, and replays a transaction
    whose key committed instead of running it again."""

    async def committed_txn(self, vchannel: str, key: str) -> AppendResult | None:
        """The CommitTxn result of the transaction with ``key`` on ``vchannel`` if one
        committed (waiting for a commit of it in flight); else None."""
        ...


@runtime_checkable
class KeyRecall(Protocol):
    """Optional: tells what became of keyed appends whose answers were lost
    (``Dedup``). A node asks it before a reconnecting producer sends its appends again
    (``LocalWAL.recall_keys``), so that they land once even after the window dropped
    their keys."""

    async def recall(
        self, keys: Sequence[tuple[str, str]], since_tick: int
    ) -> list[AppendResult | None]:
        """Per (vchannel, key) of ``keys``, each appended at or after timetick
        ``since_tick`` if at all: the result of the message it settled, or None if it
        is not in the log (an append of it in flight is waited for). Raises
        ``AppendOutcomeUnknown`` if that cannot be told."""
        ...


#: What a chain holds: objects implementing one or more of the Protocols above.
ChainMember: TypeAlias = Interceptor | BatchInterceptor | ReadyInterceptor | ClosingInterceptor


class InterceptorContext(Protocol):
    """What the WAL offers its interceptors (given to ``ReadyInterceptor.ready``)."""

    @property
    def pchannel(self) -> str:
        """The WAL's pchannel."""
        ...

    @property
    def term(self) -> int:
        """The writer's term."""
        ...

    @property
    def closed(self) -> bool:
        """True once the WAL started closing."""
        ...

    def last_tick(self) -> int:
        """The newest timetick the WAL allocated (data, control or idle tick): the WAL's
        notion of "now", by which keepalives and windows are measured."""
        ...

    def data_tick(self) -> int:
        """The timetick of the newest message the WAL serialized (idle ticks excluded)."""
        ...

    def last_confirmed_id(self) -> MessageId | None:
        """The last-confirmed id the next serialized message will carry."""
        ...

    def pin_last_confirmed(self) -> object:
        """Hold the last-confirmed id at its current value until ``unpin(token)``: a
        transaction pins it at its begin so readers resuming from any message appended
        while it is open also see its begin and body."""
        ...

    def unpin(self, token: object) -> None:
        """Release a pin taken with ``pin_last_confirmed``. Idempotent."""
        ...

    async def append_system(self, message: Message) -> AppendResult:
        """Append straight at the serialization point, bypassing every interceptor (for
        messages the interceptors themselves write: timeticks, rollbacks on expiry)."""
        ...

    def publish_idle_tick(self) -> int:
        """Allocate a tick that is not written to the log and hand it to the WAL's tailing
        scanners and tick listeners; return it. Only valid when no append is in flight."""
        ...

    def notify_tick(self, tick: int) -> None:
        """Tell the tick listeners that ``tick`` was persisted (a TimeTick message)."""
        ...

    def add_tick_listener(self, listener: TickListener) -> None:
        """Call ``listener(tick)`` on every timetick sync."""
        ...

    def remove_tick_listener(self, listener: TickListener) -> None:
        """Stop calling ``listener``. Idempotent."""
        ...

    def has_tick_listeners(self) -> bool:
        """True if a tick listener or a tailing scanner wants idle ticks."""
        ...

    def wake_on_activity(self, wake: Callable[[], object] | None) -> None:
        """Call ``wake()`` when a message is about to be serialized, a tick listener is
        added or a scanner starts waiting at the tail: whenever ``data_tick`` or
        ``has_tick_listeners`` may have changed. Until replaced (None: never); it may be
        called more than once. The timetick sync leaves a quiet WAL alone until then."""
        ...

    def read(self, deliver: DeliverPolicy = ..., filters: Iterable[Filter] = ()) -> AsyncScanner:
        """A scanner over the log, as ``WAL.read`` gives (it never ends by itself: stop at
        an id from ``latest_message_id``)."""
        ...

    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended."""
        ...

    async def last_durable_timetick(self) -> int:
        """The newest timetick in the log (the floor of this writer's ticks)."""
        ...

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        """Where a read must start to include every message with a tick >= ``timetick``
        (``Backend.start_at_timetick``): recovery reads a window of the log from here."""
        ...


class AsyncScanner(Protocol):
    """The part of ``walsvc.Scanner`` interceptors use."""

    def __aiter__(self) -> AsyncScanner: ...

    async def __anext__(self) -> ImmutableMessage: ...

    def batches(self) -> AsyncGenerator[Sequence[ImmutableMessage], None]: ...

    async def aclose(self) -> None: ...


def is_plain(message: Message) -> bool:
    """True for a message without an idempotency key or a transaction context: most
    appends, and the ones interceptors marked ``passes_plain_messages`` never see."""
    return message.idempotency_key is None and message.txn is None


#: ``user_batch_kind``'s answers.
UNCHECKED_BATCH: Final = -1
PLAIN_BATCH: Final = 0
KEYED_BATCH: Final = 1
PARTLY_KEYED_BATCH: Final = 2


def user_batch_kind(messages: list[Message]) -> int:
    """``UNCHECKED_BATCH`` unless every message is a ``Message`` itself (not a subclass)
    without a transaction context and of a type that is not a system type (the caller
    then checks each message); else ``PLAIN_BATCH`` if none carries an idempotency key,
    ``KEYED_BATCH`` if every one does, ``PARTLY_KEYED_BATCH`` if some do. One C loop
    when walsvc was built with ``walsvc/core/_speedups.c``."""
    if _compiled.user_batch_kind is not None:
        return _compiled.user_batch_kind(messages, SYSTEM_TYPES)
    keyed = 0
    for message in messages:
        if type(message) is not Message or message.txn is not None:
            return UNCHECKED_BATCH
        if message.type in SYSTEM_TYPES:
            return UNCHECKED_BATCH
        keyed += message.idempotency_key is not None
    return (
        PLAIN_BATCH if keyed == 0 else KEYED_BATCH if keyed == len(messages) else PARTLY_KEYED_BATCH
    )


def passes_plain_messages(member: ChainMember) -> bool:
    """True if ``member`` declares ``PassesPlainMessages`` (a true attribute)."""
    return isinstance(member, PassesPlainMessages) and member.passes_plain_messages is True


def manages_transactions(member: ChainMember) -> bool:
    """True if ``member`` declares ``ManagesTransactions`` (a true attribute)."""
    return isinstance(member, ManagesTransactions) and member.manages_transactions is True


def build_chain(
    members: Iterable[ChainMember], terminal: AppendNext, *, plain: bool = False
) -> AppendNext:
    """Compose the interceptors of ``members`` (first = outermost) around ``terminal``;
    with ``plain``, the chain for plain messages (members that pass them are left out)."""
    call = terminal
    for member in reversed(list(members)):
        if isinstance(member, Interceptor) and not (plain and passes_plain_messages(member)):
            call = _bind(member.do_append, call)
    return call


def build_batch_chain(
    members: Iterable[ChainMember], terminal: AppendBatchNext, *, plain: bool = False
) -> AppendBatchNext | None:
    """Compose the batch handlers of ``members`` around ``terminal`` (``plain`` as for
    ``build_chain``); None if some member of it has no batch handler (batches then go
    one message at a time)."""
    call = terminal
    for member in reversed(list(members)):
        if isinstance(member, Interceptor) and not (plain and passes_plain_messages(member)):
            if not isinstance(member, BatchInterceptor):
                return None
            call = _bind_batch(member.do_append_batch, call)
    return call


def coalescing_head(
    members: Sequence[ChainMember], terminal: AppendBatchNext
) -> tuple[CoalescingInterceptor, AppendBatchNext] | None:
    """The outermost interceptor of ``members`` and the batch chain below it around
    ``terminal``, if that interceptor is a ``CoalescingInterceptor`` and every member
    below it handles batches; else None."""
    interceptors = [i for i, member in enumerate(members) if isinstance(member, Interceptor)]
    if not interceptors:
        return None
    head = members[interceptors[0]]
    if not isinstance(head, CoalescingInterceptor):
        return None
    below = build_batch_chain(members[interceptors[0] + 1 :], terminal)
    return None if below is None else (head, below)


def plain_admitters(members: Iterable[ChainMember]) -> tuple[PlainAdmission, ...] | None:
    """The interceptors of ``members``' plain chain (first = outermost) if every one of
    them implements ``PlainAdmission`` (empty if that chain is); None if one does not."""
    chain = [
        member
        for member in members
        if isinstance(member, Interceptor) and not passes_plain_messages(member)
    ]
    admitters = tuple(member for member in chain if isinstance(member, PlainAdmission))
    return admitters if len(admitters) == len(chain) else None


def _bind(
    do_append: Callable[[Message, AppendNext], Awaitable[AppendResult]], call_next: AppendNext
) -> AppendNext:
    def step(message: Message) -> Awaitable[AppendResult]:
        return do_append(message, call_next)  # no extra coroutine frame per layer

    return step


def _bind_batch(
    do_append_batch: Callable[[Sequence[Message], AppendBatchNext], Awaitable[list[AppendResult]]],
    call_next: AppendBatchNext,
) -> AppendBatchNext:
    def step(messages: Sequence[Message]) -> Awaitable[list[AppendResult]]:
        return do_append_batch(messages, call_next)

    return step
