"""Dedup: exactly-once appends for messages and transactions with an idempotency key.

Per (vchannel, key), within a window bounded by count and age:
- the first append of a key owns it and appends. The append runs to its end even when
  its caller is cancelled or times out (it may already be on its way to the log), and
  its outcome, not the caller's, settles the key;
- a retry of a settled key gets the original ``AppendResult`` and appends nothing;
- retries made while the owner is in flight (a retry after a timeout is one) wait for
  its outcome, then get its result (or, if it failed without writing, one of them
  becomes the owner);
- an ambiguous failure (``AppendOutcomeUnknown``) does not release the key: the log from
  the owner's last-confirmed id to its end is read first. Found: the caller gets its
  result. Not found: the key is released and the error raised. If the log cannot be read,
  the key is blocked: every retry reads again, and raises ``AppendOutcomeUnknown`` until a
  read tells;
- a transaction's key (``WAL.begin_txn(..., idempotency_key=)``) is settled by its
  CommitTxn, which carries it. ``WAL.begin_txn`` asks ``committed_txn`` first, so a retried
  transaction whose commit landed appends nothing; a commit whose key committed meanwhile
  (two transactions with one key, open at once) becomes a rollback of its own
  transaction and is answered with the first commit's result;
- on open the window is rebuilt from the log in the background: the messages younger than
  ``max_age``, read from where the backend says they begin (``Backend.start_at_timetick``),
  never the whole retained log. Keyed appends wait for the rebuild; plain appends never
  do. If it fails for good (damage in the window) keyed appends raise its error, since
  exactly-once cannot be promised over a log that cannot be read; a retriable failure is
  retried by the next keyed append.
Milvus (PR #50007) loses its window on restart and releases keys on ambiguous errors.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Any, Final, TypeVar, final

from walsvc.core._chain import AppendBatchNext, AppendNext, InterceptorContext
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    InvalidArgument,
    InvalidMessage,
    WALError,
    WALTruncated,
)
from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, Message, MessageType
from walsvc.core._timetick import span_of_ms

from ._reading import read_through

__all__ = ("DEFAULT_MAX_AGE", "DEFAULT_MAX_KEYS", "Dedup")

#: Keys remembered per WAL (all vchannels together).
DEFAULT_MAX_KEYS: Final = 100_000
#: Seconds a settled key is remembered (by timetick, so across restarts too).
DEFAULT_MAX_AGE: Final = 600.0

_Key = tuple[str, str]  # (vchannel, idempotency key)
_T = TypeVar("_T")


@final
class _Entry:
    """One key of the window: settled (``result``), in flight (``owner`` running), or
    blocked (``owner`` done without a result: its outcome could not be read)."""

    __slots__ = ("floor", "owner", "result", "txn")

    def __init__(self, floor: MessageId | None, txn: bool) -> None:
        #: At or before where the keyed message lands: resolution reads from here.
        self.floor = floor
        #: True if the key names a transaction (settled by its CommitTxn).
        self.txn = txn
        self.result: AppendResult | None = None
        self.owner: asyncio.Future[Any] | None = None


@final
class Dedup:
    """The dedup interceptor (see the module docs). ``max_keys`` bounds memory;
    ``max_age`` (seconds, measured in timeticks) bounds how long a key is remembered and
    how much log the rebuild on open reads."""

    #: Messages without a key pass straight through (see ``walsvc.core._chain``).
    passes_plain_messages: Final = True

    __slots__ = (
        "_age_ticks",
        "_context",
        "_max_keys",
        "_owners",
        "_rebuild",
        "_window",
        "rebuilt",
    )

    def __init__(
        self, *, max_keys: int = DEFAULT_MAX_KEYS, max_age: float = DEFAULT_MAX_AGE
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1, not {max_keys!r}")
        if not (isinstance(max_age, int | float) and math.isfinite(max_age) and max_age > 0):
            raise ValueError(f"max_age must be seconds > 0, not {max_age!r}")
        self._max_keys = max_keys
        self._age_ticks = span_of_ms(round(max_age * 1000))
        self._context: InterceptorContext | None = None
        self._window: OrderedDict[_Key, _Entry] = OrderedDict()
        self._rebuild: asyncio.Task[None] | None = None
        self._owners: set[asyncio.Future[Any]] = set()
        #: How many keys the rebuild on open recovered from the log.
        self.rebuilt = 0

    def __len__(self) -> int:
        """How many keys the window holds."""
        return len(self._window)

    # -- the window on open -------------------------------------------------------------

    async def ready(self, context: InterceptorContext) -> None:
        """Bind to the WAL and start rebuilding the window from the log (in the
        background: see ``wait_rebuilt``)."""
        if self._context is not None:
            raise RuntimeError("a Dedup interceptor serves one WAL")
        self._context = context
        self._rebuild = asyncio.ensure_future(self._rebuild_window(context))
        self._rebuild.add_done_callback(_collect)

    async def wait_rebuilt(self) -> None:
        """Return once the window holds every key of the log's last ``max_age``; raise
        the rebuild's error if it failed (keyed appends raise it too). A rebuild that
        failed retriably is started again."""
        rebuild = self._rebuild
        if rebuild is None:
            raise RuntimeError("Dedup is not bound to a WAL yet")
        if rebuild.done() and not rebuild.cancelled():
            error = rebuild.exception()
            if isinstance(error, WALError) and error.retriable and self._context is not None:
                rebuild = self._rebuild = asyncio.ensure_future(self._rebuild_window(self._context))
                rebuild.add_done_callback(_collect)
        if not rebuild.done():
            await asyncio.wait((rebuild,))
        if rebuild.cancelled():
            raise AppendOutcomeUnknown("the dedup window was not rebuilt: the WAL is closing")
        error = rebuild.exception()
        if error is not None:
            raise _copy(error, "; the dedup window could not be rebuilt from the log") from error

    async def _rebuild_window(self, context: InterceptorContext) -> None:
        latest = await context.latest_message_id()
        if latest is None:
            return
        floor = max(0, await context.last_durable_timetick() - self._age_ticks)
        start = await context.start_at_timetick(floor)
        # Each message is noted as the scanner delivers it, so the rebuild works a step
        # of the read at a time (the read yields to the loop between steps, see
        # walsvc.core._budget) and never holds the whole window's messages.
        try:
            async for message in read_through(context, start, latest, floor):
                self._note_settled(message)
        except WALTruncated:  # truncated meanwhile: what is retained is all there is
            async for message in read_through(context, DeliverPolicy.all(), latest, floor):
                self._note_settled(message)
        self._evict()

    def _note_settled(self, message: ImmutableMessage) -> None:
        """Put a keyed message the rebuild read into the window."""
        key = _settled_key(message)
        if key is not None and key not in self._window:
            entry = _Entry(None, message.txn is not None)
            entry.result = _result_of(message)
            self._window[key] = entry  # keyed appends wait for this: the window was empty
            self.rebuilt += 1
            if len(self._window) > self._max_keys:
                self._evict()  # one key at a time, not the excess of a whole window at the end

    # -- appends ------------------------------------------------------------------------

    def do_append(self, message: Message, call_next: AppendNext) -> Awaitable[AppendResult]:
        """Answer a retried key from the window; append a new one (messages without a
        key pass straight through)."""
        key = message.idempotency_key
        if key is None:
            return call_next(message)
        return self._keyed(message, (message.vchannel, key), call_next)

    async def _keyed(self, message: Message, key: _Key, call_next: AppendNext) -> AppendResult:
        txn = message.txn is not None
        if txn and message.type is not MessageType.COMMIT_TXN:
            raise InvalidMessage("in a transaction only its CommitTxn carries the key")
        settled = await self._settled(key, txn)
        if settled is not None:
            if txn:  # a second transaction with a committed key: end it, answer the first
                await self._roll_back_duplicate(message, call_next)
            return settled
        entry = self._window[key] = _Entry(self._bound().last_confirmed_id(), txn)
        return await self._own((entry,), self._append_one(key, entry, message, call_next))

    def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Awaitable[list[AppendResult]]:
        """A batch without keys passes through. A batch with keys is answered from the
        window where it can be, and the rest is appended as one batch; if a key of it is
        in flight in another append (or twice in the batch), it goes one at a time."""
        if all(m.idempotency_key is None for m in messages):
            return call_next(messages)
        return self._keyed_batch(messages, call_next)

    async def _keyed_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        await self.wait_rebuilt()
        window = self._window
        keys = [
            None if m.idempotency_key is None else (m.vchannel, m.idempotency_key) for m in messages
        ]
        claimed = [k for k in keys if k is not None]
        if len(set(claimed)) != len(claimed) or any(
            (entry := window.get(k)) is not None and entry.result is None for k in claimed
        ):
            return await self._one_at_a_time(messages, call_next)
        results: list[AppendResult | None] = []
        for key in keys:
            known = None if key is None else window.get(key)
            if key is not None and known is not None and known.txn:
                raise _kind_mismatch(key, True)
            results.append(None if known is None else known.result)
        fresh = [i for i, r in enumerate(results) if r is None]
        if fresh:
            floor = self._bound().last_confirmed_id()
            entries: dict[int, _Entry] = {}
            for i in fresh:
                key = keys[i]
                if key is not None:
                    entries[i] = window[key] = _Entry(floor, False)
            batch = [messages[i] for i in fresh]
            owner = self._append_batch(keys, entries, batch, fresh, call_next)
            appended = await self._own(list(entries.values()), owner)
            for i, result in zip(fresh, appended, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    async def _one_at_a_time(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        async def one(message: Message) -> AppendResult:
            (result,) = await call_next((message,))
            return result

        return [await self.do_append(m, one) for m in messages]

    # -- owners: the appends that settle keys ---------------------------------------------

    async def _own(self, entries: Sequence[_Entry], work: Awaitable[_T]) -> _T:
        """Run ``work`` (the append of ``entries``' keys) as their owner: to its end,
        whatever becomes of the caller, who gets its outcome unless cancelled first."""
        owner = asyncio.ensure_future(work)
        for entry in entries:
            entry.owner = owner
        self._owners.add(owner)
        owner.add_done_callback(self._owners.discard)
        owner.add_done_callback(_collect)  # its caller may be gone
        return await asyncio.shield(owner)

    async def _append_one(
        self, key: _Key, entry: _Entry, message: Message, call_next: AppendNext
    ) -> AppendResult:
        try:
            result = await call_next(message)
        except AppendOutcomeUnknown as exc:
            return await self._resolve(key, entry, exc)
        except BaseException:
            self._release(key, entry)  # nothing was written
            raise
        self._settle(entry, result)
        return result

    async def _append_batch(
        self,
        keys: list[_Key | None],
        entries: dict[int, _Entry],
        batch: list[Message],
        fresh: list[int],
        call_next: AppendBatchNext,
    ) -> list[AppendResult]:
        try:
            appended = await call_next(batch)
        except AppendOutcomeUnknown as exc:
            # Each key is looked up in the log: found ones answer, the rest are released.
            found: list[AppendResult | None] = []
            for i in fresh:
                key, entry = keys[i], entries.get(i)
                if key is None or entry is None:
                    found.append(None)  # an unkeyed message cannot be looked up
                    continue
                try:
                    found.append(await self._resolve(key, entry, exc))
                except AppendOutcomeUnknown as unresolved:
                    if unresolved is not exc:
                        raise
                    found.append(None)
            if any(r is None for r in found):
                raise  # a retry appends what is missing and is answered for the rest
            return [r for r in found if r is not None]
        except BaseException:
            for i, entry in entries.items():
                key = keys[i]
                assert key is not None
                self._release(key, entry)  # nothing was written
            raise
        for i, result in zip(fresh, appended, strict=True):
            entry = entries.get(i)
            if entry is not None:
                self._settle(entry, result)
        return appended

    def _settle(self, entry: _Entry, result: AppendResult) -> None:
        entry.result = result
        self._evict()

    # -- looking keys up ------------------------------------------------------------------

    async def committed_txn(self, vchannel: str, key: str) -> AppendResult | None:
        """The CommitTxn result of the transaction with ``key`` on ``vchannel``, if one
        committed within the window (waiting for a commit of it in flight); else None."""
        return await self._settled((vchannel, key), True)

    async def _settled(self, key: _Key, txn: bool) -> AppendResult | None:
        """The result ``key`` settled with; None if it is free (the caller may own it
        at once: nothing awaits between this returning None and the caller's claim)."""
        await self.wait_rebuilt()
        retried = False
        while True:
            entry = self._window.get(key)
            if entry is None:
                return None
            if entry.result is not None:
                if entry.txn != txn:
                    raise _kind_mismatch(key, entry.txn)
                return entry.result
            owner = entry.owner
            if owner is not None and not owner.done():
                await asyncio.wait((owner,))  # the owner's outcome, not its caller's
            elif retried:
                raise AppendOutcomeUnknown(
                    f"whether the append of key {key[1]!r} on vchannel {key[0]!r} landed is"
                    " still unknown: the log could not be read to tell, so the key stays"
                    " blocked (each retry reads it again)"
                )
            else:  # blocked: read the log again, as this retry's owner
                retried = True
                try:
                    await self._own((entry,), self._resolve_again(key, entry))
                except AppendOutcomeUnknown:
                    pass  # still blocked: said above, on the next turn

    async def _resolve_again(self, key: _Key, entry: _Entry) -> None:
        """``_resolve`` for a blocked key: settled or released (free to append), unless
        the log still cannot be read (raises ``AppendOutcomeUnknown``)."""
        unknown = AppendOutcomeUnknown(f"the append of key {key[1]!r} may have landed")
        try:
            await self._resolve(key, entry, unknown)
        except AppendOutcomeUnknown as exc:
            if exc is not unknown:
                raise

    async def _resolve(self, key: _Key, entry: _Entry, error: AppendOutcomeUnknown) -> AppendResult:
        """Find whether the ambiguous append of ``key`` landed: settle it (found) or
        release it and raise ``error`` (not found). If the log cannot be read, the key
        stays blocked and ``AppendOutcomeUnknown`` says so."""
        context = self._bound()
        try:
            found = await self._find(context, key, entry.floor)
        except (WALError, OSError) as exc:
            raise AppendOutcomeUnknown(
                f"{error}; and reading the log to resolve key {key[1]!r} failed ({exc!r}):"
                " the key stays blocked until the log can be read to tell (each retry reads"
                " it again)"
            ) from error
        if found is None:
            self._release(key, entry)
            raise error
        self._settle(entry, found)
        return found

    async def _find(
        self, context: InterceptorContext, key: _Key, floor: MessageId | None
    ) -> AppendResult | None:
        latest = await context.latest_message_id()
        if latest is None or (floor is not None and latest < floor):
            return None
        start = DeliverPolicy.all() if floor is None else DeliverPolicy.start_from(floor)
        async for message in read_through(context, start, latest, 0):
            if _settled_key(message) == key:
                return _result_of(message)
        return None

    # -- bookkeeping ------------------------------------------------------------------------

    @staticmethod
    async def _roll_back_duplicate(commit: Message, call_next: AppendNext) -> None:
        """End a transaction whose key another transaction committed with: its body must
        never be delivered. Best effort: if the rollback cannot be written, the
        transaction expires (its keepalive) and readers drop its body all the same."""
        rollback = Message(
            payload=b"", vchannel=commit.vchannel, type=MessageType.ROLLBACK_TXN, txn=commit.txn
        )
        try:
            await call_next(rollback)
        except WALError:
            pass

    def _bound(self) -> InterceptorContext:
        assert self._context is not None, "appends wait for ready()"
        return self._context

    def _release(self, key: _Key, entry: _Entry) -> None:
        if self._window.get(key) is entry:
            del self._window[key]

    def _evict(self) -> None:
        """Drop the oldest settled keys beyond ``max_keys`` or older than ``max_age``."""
        window = self._window
        context = self._context
        horizon = (context.last_tick() if context is not None else 0) - self._age_ticks
        while window:
            key, entry = next(iter(window.items()))
            if entry.result is None:
                break  # the oldest is in flight; the bound is met once it settles
            if len(window) > self._max_keys or entry.result.timetick < horizon:
                del window[key]
                continue
            break

    async def aclose(self) -> None:
        """Stop the rebuild and wait for the owners still appending (their callers may
        have gone; their outcome settles nothing any more, but they must finish before
        the backend closes)."""
        if self._rebuild is not None and not self._rebuild.done():
            self._rebuild.cancel()
        if self._owners:
            await asyncio.wait(list(self._owners))


def _settled_key(message: ImmutableMessage) -> _Key | None:
    """The window key a message in the log settles: a keyed message outside
    transactions, or a transaction's CommitTxn."""
    key = message.idempotency_key
    if key is None or (message.txn is not None and message.type is not MessageType.COMMIT_TXN):
        return None
    return (message.vchannel, key)


def _result_of(message: ImmutableMessage) -> AppendResult:
    return AppendResult(message.message_id, message.timetick, message.last_confirmed_id)


def _kind_mismatch(key: _Key, names_txn: bool) -> InvalidArgument:
    kind = "a transaction" if names_txn else "a message"
    return InvalidArgument(
        f"idempotency key {key[1]!r} on vchannel {key[0]!r} already names {kind}; a key"
        " names one message or one transaction"
    )


def _copy(error: BaseException, note: str) -> WALError:
    """A fresh error of ``error``'s type (a WALError) saying ``note`` too."""
    if isinstance(error, WALError):
        return type(error)(f"{error}{note}")
    return AppendOutcomeUnknown(f"{error!r}{note}")


def _collect(task: asyncio.Future[Any]) -> None:
    """Mark a background task's outcome as seen."""
    if not task.cancelled():
        task.exception()
