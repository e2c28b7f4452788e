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
- on open the window is rebuilt from the log in the background: the newest ``max_keys``
  keys younger than ``max_age``, read back from the newest tick in stretches that each
  start where the backend says their tick begins (``Backend.start_at_timetick``): about
  as much log as those keys span, never the whole retained log. Keyed appends wait for
  the rebuild; plain appends never do. If it fails for good (damage in the window) keyed
  appends raise its error, since exactly-once cannot be promised over a log that cannot
  be read; a retriable failure is retried by the next keyed append. A WAL that closes
  stops the rebuild first (``begin_close``): keyed appends waiting for it raise
  ``WALClosed``, and the close never waits on a read that does not return.
Concurrent keyed appends are taken together (``do_append_coalesced``: the WAL gathers
them, see ``walsvc.CoalescingInterceptor``): their new keys are claimed at once and
appended as one batch, whose owner is the WAL's task for it, and each key is settled from
its result; the promises above are the same for them. Most keys of the window are settled
message keys, held as their bare ``AppendResult``; an ``append_many`` of new counted keys
(a remote producer's, ``walsvc.producer_key``'s) is claimed, settled and evicted as one
``Run`` (``_dedup_runs``), the same keys in another form, and so is a coalesced batch
whose keys are such a run (the appends of one remote producer's frame, on the node). The
window's bookkeeping (its keys, their order, eviction) is ``_dedup_window.Window``'s; the
appends of claimed keys, settled or released from their outcome, are
``_dedup_claims.ClaimedAppends``'; what it reads for keys whose outcome is not at hand
(owners in flight, ambiguous appends, recalls) is ``_dedup_lookup.KeyLookup``'s.
Milvus (PR #50007) loses its window on restart and releases keys on ambiguous errors.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Sequence
from itertools import islice, repeat
from typing import Any, Final, TypeVar, cast, final

from walsvc.core._chain import AppendBatchNext, AppendNext, InterceptorContext
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    InvalidMessage,
    WALClosed,
    WALError,
)
from walsvc.core._message import AppendResult, Message, MessageType
from walsvc.core._timetick import span_of_ms

from ._dedup_claims import ClaimedAppends, RunClaim, TableClaim
from ._dedup_lookup import KeyLookup, kind_mismatch
from ._dedup_slots import Entry, Key, in_flight, key_of
from ._dedup_window import Window
from ._newest_keys import newest_settled
from ._shards import window_keys

__all__ = ("DEFAULT_MAX_AGE", "DEFAULT_MAX_KEYS", "Dedup")

#: Keys remembered per WAL (all vchannels together).
DEFAULT_MAX_KEYS: Final = 100_000
#: Seconds a settled key is remembered (by timetick, so across restarts too).
DEFAULT_MAX_AGE: Final = 600.0
#: Keys the rebuild on open puts into the window per turn of the event loop (about
#: 1 us each).
_NOTE_STEP: Final = 512

_T = TypeVar("_T")


@final
class Dedup:
    """The dedup interceptor (see the module docs). ``max_keys`` bounds memory;
    ``max_age`` (seconds, measured in timeticks) bounds how long a key is remembered;
    both bound how much log the rebuild on open reads."""

    #: Messages without a key pass straight through (see ``walsvc.core._chain``).
    passes_plain_messages: Final = True

    __slots__ = (
        "_appends",
        "_context",
        "_keys",
        "_lookup",
        "_owners",
        "_rebuild",
        "_stopped",
        "_window",
        "hits",
        "rebuilt",
    )

    def __init__(
        self, *, max_keys: int = DEFAULT_MAX_KEYS, max_age: float = DEFAULT_MAX_AGE
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1, not {max_keys!r}")
        if not (isinstance(max_age, int | float) and math.isfinite(max_age) and max_age > 0):
            raise ValueError(f"max_age must be seconds > 0, not {max_age!r}")
        self._context: InterceptorContext | None = None
        self._keys = Window(max_keys, span_of_ms(round(max_age * 1000)))
        # The window's dict itself, on the hot paths (never replaced).
        self._window = self._keys.slots
        self._rebuild: asyncio.Task[None] | None = None
        self._stopped = False  # begin_close ran: no rebuild (again)
        self._owners: set[asyncio.Future[Any]] = set()
        self._lookup = KeyLookup(self._keys, self._bound, self._own)
        self._appends = ClaimedAppends(self._keys, self._lookup)
        #: Keyed appends answered without appending: a retry of a settled key, or a
        #: key twice in one batch.
        self.hits = 0
        #: How many keys the rebuild on open recovered from the log.
        self.rebuilt = 0

    def __len__(self) -> int:
        """How many keys the window holds."""
        return len(self._keys)

    # -- the window on open -------------------------------------------------------------

    async def ready(self, context: InterceptorContext) -> None:
        """Bind to the WAL and start rebuilding the window from the log (in the
        background: see ``wait_rebuilt``)."""
        if self._context is not None:
            raise RuntimeError("a Dedup interceptor serves one WAL")
        self._context = context
        self._keys.last_tick = context.last_tick
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
            if (
                isinstance(error, WALError)
                and error.retriable
                and self._context is not None
                and not self._stopped
            ):
                rebuild = self._rebuild = asyncio.ensure_future(self._rebuild_window(self._context))
                rebuild.add_done_callback(_collect)
        if not rebuild.done():
            await asyncio.wait((rebuild,))
        if rebuild.cancelled():  # by begin_close: nothing waiting for it reached the log
            raise WALClosed("the WAL closed before its dedup window was rebuilt")
        error = rebuild.exception()
        if error is not None:
            raise _copy(error, "; the dedup window could not be rebuilt from the log") from error

    def _rebuilt(self) -> bool:
        """True once the window was rebuilt (and the rebuild did not fail)."""
        rebuild = self._rebuild
        return (
            rebuild is not None
            and rebuild.done()
            and not rebuild.cancelled()
            and rebuild.exception() is None
        )

    async def _rebuild_window(self, context: InterceptorContext) -> None:
        latest = await context.latest_message_id()
        if latest is None:
            return
        window = self._keys
        floor = max(0, await context.last_durable_timetick() - window.age_ticks)
        # The newest keys the window holds, not every key younger than max_age: a busy
        # log is read back about as far as its newest max_keys keys go (_newest_keys).
        complete_from, settled = await newest_settled(context, floor, latest, window.max_keys)
        window.forgotten_below = max(window.forgotten_below, complete_from)  # not read
        while step := list(islice(settled, _NOTE_STEP)):
            for item in step:
                self.rebuilt += window.note_settled(item.key, item.result, item.txn)
            await asyncio.sleep(0)  # a step at a time: the loop is not held
        window.evict()

    # -- appends ------------------------------------------------------------------------

    def do_append(self, message: Message, call_next: AppendNext) -> Awaitable[AppendResult]:
        """Answer a retried key from the window; append a new one (messages without a
        key pass straight through)."""
        key = message.idempotency_key
        if key is None:
            return call_next(message)
        return self._keyed(message, key_of(message.vchannel, key), call_next)

    async def _keyed(self, message: Message, key: Key, call_next: AppendNext) -> AppendResult:
        txn = message.txn is not None
        if txn and message.type is not MessageType.COMMIT_TXN:
            raise InvalidMessage("in a transaction only its CommitTxn carries the key")
        settled = await self._settled(key, txn)
        if settled is not None:
            self.hits += 1
            if txn:  # a second transaction with a committed key: end it, answer the first
                await self._roll_back_duplicate(message, call_next)
            return settled
        entry = Entry(self._bound().last_confirmed_id(), txn)
        self._window[key] = entry
        self._keys.order.append(key)
        return await self._own(entry, self._appends.append_one(key, entry, message, call_next))

    def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Awaitable[list[AppendResult]]:
        """A batch without keys passes through. A batch with keys waits for the appends
        of its keys in flight elsewhere, is answered from the window where it can be, and
        the rest is appended as one batch (a key twice in it: appended once, both answered
        with that result)."""
        if all(m.idempotency_key is None for m in messages):
            return call_next(messages)
        return self._keyed_batch(messages, call_next)

    async def _keyed_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        if not self._rebuilt():
            await self.wait_rebuilt()
        # A run of new counted keys (a remote producer's append_many): one claim.
        run = self._keys.claim_run(messages, self._bound().last_confirmed_id())
        if run is not None:
            work = self._appends.append_batch(RunClaim(run), list(messages), call_next)
            return await self._own(run.entry, work)
        # Every message's key in one C loop; None if one has no key or a NUL in its vchannel.
        keys = cast("list[Key | None] | None", window_keys(messages))
        if keys is None:
            keys = [
                None if m.idempotency_key is None else key_of(m.vchannel, m.idempotency_key)
                for m in messages
            ]
        if None not in keys:  # the usual batch: keyed, every key new
            entry = Entry(self._bound().last_confirmed_id(), False)
            claim = TableClaim(cast("list[Key]", keys), entry)
            if self._claim_new(claim.keys, entry):
                work = self._appends.append_batch(claim, list(messages), call_next)
                return await self._own(entry, work)
        held: list[Key] = []  # the keys waited on, held from eviction until read below
        try:
            return await self._keyed_batch_slowly(messages, keys, call_next, held)
        finally:
            self._keys.unhold(held)

    def _claim_new(self, keys: list[Key], entry: Entry) -> bool:
        """Claim each of ``keys`` under ``entry`` and return True if every one is new (not
        in the window, not twice in ``keys``); else claim none and return False."""
        if self._keys.runs and self._keys.runs.any_of(keys):
            return False  # a run holds one
        window = self._window
        size = len(window)
        # One probe per key, in C loops; a key already there keeps its slot, and the
        # window grows by fewer than the keys.
        deque(map(window.setdefault, keys, repeat(entry)), maxlen=0)
        if len(window) - size == len(keys):
            self._keys.order.extend(keys)
            return True
        for key in keys:  # a key known, or twice: unclaimed
            if window.get(key) is entry:
                del window[key]
        return False

    async def _keyed_batch_slowly(
        self,
        messages: Sequence[Message],
        keys: list[Key | None],
        call_next: AppendBatchNext,
        held: list[Key],
    ) -> list[AppendResult]:
        """``_keyed_batch`` for a batch with a key that is not new (settled, in flight,
        or twice in it) or without a key: the keys it waits on go to ``held``."""
        window = self._window
        get = self._keys.get  # the table's keys and the runs'
        while True:
            if not self._rebuilt():
                await self.wait_rebuilt()
            # The keys the window holds (usually none), with their slots.
            known = {k: slot for k in keys if k is not None and (slot := get(k)) is not None}
            waiting = [k for k, slot in known.items() if in_flight(slot)]
            if not waiting:
                break  # and nothing awaits from here to the claims
            self._keys.hold(waiting)
            held += waiting
            for busy in waiting:
                await self._settled(busy, False)  # its owner's outcome, or a read of the log
        for settled in known:
            if type(get(settled)) is Entry:
                raise kind_mismatch(settled, True)  # a settled transaction key
        entry = Entry(self._bound().last_confirmed_id(), False)
        batch: list[Message] = []
        claimed: list[Key | None] = []  # the key of each message of ``batch``
        first: dict[Key, int] = {}  # where each claimed key is in ``batch``
        answers: list[AppendResult | int] = []  # a settled result, or a place in ``batch``
        for message, key in zip(messages, keys, strict=True):
            if key is not None:
                slot = get(key)
                if slot is entry:  # twice in this batch: answered as the first
                    answers.append(first[key])
                    self.hits += 1
                    continue
                if slot is not None:
                    assert isinstance(slot, AppendResult)
                    answers.append(slot)
                    self.hits += 1
                    continue
                window[key] = entry
                first[key] = len(batch)
            answers.append(len(batch))
            batch.append(message)
            claimed.append(key)
        if not batch:
            return [a for a in answers if isinstance(a, AppendResult)]  # every key was settled
        keys_claimed = [k for k in claimed if k is not None]
        self._keys.order.extend(keys_claimed)
        claim = TableClaim(keys_claimed, entry)
        appended = await self._own(
            entry, self._appends.append_batch(claim, batch, call_next, claimed)
        )
        if len(batch) == len(messages):
            return appended
        return [appended[a] if isinstance(a, int) else a for a in answers]

    async def do_append_coalesced(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Sequence[AppendResult | Exception | None]:
        """Keyed appends of concurrent callers together (``walsvc.CoalescingInterceptor``):
        settled keys are answered, new ones claimed and appended as one batch, and settled
        from its results in one pass (a key twice in the batch: appended once, both
        answered). A key in flight in another append, blocked, or naming a transaction is
        left to ``do_append`` (None), which waits for it, reads the log or refuses it; so
        is every message while the window cannot be rebuilt."""
        if not self._rebuilt():
            try:
                await self.wait_rebuilt()
            except WALError:
                return [None] * len(messages)  # do_append raises it, a fresh copy each
        floor = self._bound().last_confirmed_id()
        # The appends of one remote producer's frame: a run of new counted keys, one claim.
        run = self._keys.claim_run(messages, floor)
        if run is not None:
            work = self._appends.append_coalesced(RunClaim(run), list(messages), call_next)
            return await self._owning(run.entry, work)
        entry = Entry(floor, False)
        keys = cast("list[Key] | None", window_keys(messages))  # a message has a key
        if keys is not None and self._claim_new(keys, entry):  # the usual batch: all new
            work = self._appends.append_coalesced(
                TableClaim(keys, entry), list(messages), call_next
            )
            return await self._owning(entry, work)
        window = self._window
        get = self._keys.get  # the table's keys and the runs'
        batch: list[Message] = []
        claimed: list[Key] = []  # the key of each message of ``batch``
        others: dict[int, AppendResult | int | None] = {}  # messages not in ``batch``
        claim, add = claimed.append, batch.append
        for i, message in enumerate(messages):
            vchannel = message.vchannel
            key: Key = (
                f"{vchannel}\0{message.idempotency_key}"  # _key, inline: once per append
                if "\0" not in vchannel
                else (vchannel, message.idempotency_key)  # type: ignore[assignment]
            )
            slot = get(key)
            if slot is None:
                window[key] = entry
                claim(key)
                add(message)
            elif type(slot) is AppendResult:
                others[i] = slot  # settled
                self.hits += 1
            elif slot is entry:  # twice in this batch: answered as the first
                others[i] = claimed.index(key)
                self.hits += 1
            else:
                others[i] = None  # in flight in another append, blocked, or a transaction's
        if not batch:
            return [None if isinstance(a, int) else a for a in others.values()]
        self._keys.order.extend(claimed)
        work = self._appends.append_coalesced(TableClaim(claimed, entry), batch, call_next)
        outcomes = await self._owning(entry, work)
        if not others:
            return outcomes  # the usual batch: every key was new
        answered: list[AppendResult | Exception | None] = []
        fresh = iter(outcomes)
        for i in range(len(messages)):
            if i not in others:
                answered.append(next(fresh))
                continue
            other = others[i]
            if isinstance(other, int):  # a repeat: a key that failed tries again alone
                outcome = outcomes[other]
                answered.append(outcome if isinstance(outcome, AppendResult) else None)
            else:
                answered.append(other)
        return answered

    async def _owning(
        self, entry: Entry, work: Awaitable[Sequence[AppendResult | Exception | None]]
    ) -> Sequence[AppendResult | Exception | None]:
        """``work`` (a coalesced batch's append), with ``entry`` owned meanwhile by a
        future of its own (the WAL's coalescing task runs the batch to its end, whatever
        its callers do)."""
        owner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry.owner = owner
        self._owners.add(owner)
        try:
            return await work
        finally:
            self._owners.discard(owner)
            owner.set_result(None)
            entry.drop_owner(owner)

    # -- owners: the appends that settle keys ---------------------------------------------

    async def _own(self, entry: Entry, work: Awaitable[_T]) -> _T:
        """Run ``work`` (the append of ``entry``'s keys) as their owner: to its end,
        whatever becomes of the caller, who gets its outcome unless cancelled first."""
        owner = entry.owner = asyncio.ensure_future(work)
        self._owners.add(owner)
        owner.add_done_callback(self._owners.discard)
        owner.add_done_callback(entry.drop_owner)
        owner.add_done_callback(_collect)  # its caller may be gone
        return await asyncio.shield(owner)

    # -- looking keys up ------------------------------------------------------------------

    async def committed_txn(self, vchannel: str, key: str) -> AppendResult | None:
        """The CommitTxn result of the transaction with ``key`` on ``vchannel``, if one
        committed within the window (waiting for a commit of it in flight); else None."""
        return await self._settled(key_of(vchannel, key), True)

    async def _settled(self, key: Key, txn: bool) -> AppendResult | None:
        """The result ``key`` settled with; None if it is free (the caller may own it
        at once: nothing awaits between this returning None and the caller's claim)."""
        await self.wait_rebuilt()
        self._keys.hold((key,))
        try:
            return await self._lookup.settled(key, txn)
        finally:
            self._keys.unhold((key,))

    # -- recalling keys the window may have dropped ---------------------------------------

    async def recall(
        self, keys: Sequence[tuple[str, str]], since_tick: int
    ) -> list[AppendResult | None]:
        """Per (vchannel, key) of ``keys``, appended at or after ``since_tick`` if at all:
        the result of the message that settled it, or None if none did (and none is in
        flight: an append in flight is waited for). A key the window holds is answered
        from it; one it may have dropped (settled below ``forgotten_below``, which passed
        ``since_tick``) is looked up in the log from ``since_tick`` up to
        ``forgotten_below``, and put back into the window if found. One read of the log
        serves all of ``keys``, and ends once it has found them all.

        For a producer that lost its answers (a reconnecting client of a node) and
        knows that nothing it sends again was sent before a timetick it had seen:
        answered from here, its appends land once however many keys the window
        dropped meanwhile. Raises ``AppendOutcomeUnknown`` if it cannot be told: the
        log cannot be read there (damaged), or a key's earlier outcome is still unknown
        (blocked). Keys of truncated messages are forgotten, as on open."""
        await self.wait_rebuilt()
        wanted = [key_of(vchannel, key) for vchannel, key in keys]
        self._keys.hold(wanted)
        try:
            return await self._lookup.recall(wanted, since_tick)
        finally:
            self._keys.unhold(wanted)
            self._keys.evict()

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

    def begin_close(self) -> None:
        """Stop the rebuild, once: the appends waiting for it raise ``WALClosed`` (a
        rebuild stuck in a read would otherwise hold the WAL's close). Idempotent: a
        second cancel would cut short the clean-up of its read (a client stopping)."""
        if self._stopped:
            return
        self._stopped = True
        if self._rebuild is not None and not self._rebuild.done():
            self._rebuild.cancel()

    async def aclose(self) -> None:
        """Stop the rebuild and wait for its read to close, and for the owners still
        appending (their callers may have gone; their outcome settles nothing any more):
        all of them before the backend closes."""
        self.begin_close()
        rebuild = self._rebuild
        if rebuild is not None and not rebuild.done():
            await asyncio.wait((rebuild,))
        if self._owners:
            await asyncio.wait(list(self._owners))


def _copy(error: BaseException, note: str) -> WALError:
    """A fresh error of ``error``'s type (a WALError) saying ``note`` too."""
    if isinstance(error, WALError):
        return type(error)(f"{error}{note}")
    return AppendOutcomeUnknown(f"{error!r}{note}")


def _collect(task: asyncio.Future[Any]) -> None:
    """Mark a background task's outcome as seen."""
    if not task.cancelled():
        task.exception()
