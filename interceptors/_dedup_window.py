"""The dedup window: which keys are known, what each holds, and the order they leave in.

``Window`` is the bookkeeping under ``Dedup``: a table from window key to slot (a settled
message key's ``AppendResult``, or an ``Entry``: in flight, blocked, or a settled
transaction key; ``_dedup_slots``), the runs of counted keys (a batch's keys in one
``Run``: ``_dedup_runs``), the keys and runs in the order they were claimed (or read,
on open), the stale entries of that order (one per release: a released key may be
claimed again), and the keys a retry waits on (held: eviction stops at them). ``get``
reads a key's slot from either. ``evict`` drops the oldest settled keys beyond
``max_keys`` or older than ``age_ticks``; it never drops a key in flight or held, and it
notes the newest tick it dropped (``forgotten_below``): below that tick, a key missing
from the window may still be in the log. Nothing here awaits: ``Dedup`` decides who
claims, settles and releases, and this keeps the window true to it. The table is a
``ShardedDict`` (``_shards``): a dict in shards, so that a rebuild under churn holds the
loop for one shard, not the window; the order is a ``KeyQueue``, which the cycle
collector does not read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter
from typing import final

from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, Message

from ._dedup_runs import Run, Runs
from ._dedup_slots import Entry, Key, Slot, key_of
from ._shards import (
    KeyQueue,
    Queue,
    ShardedDict,
    Table,
    counted,
    counted_run,
    evict_settled,
    window_keys,
)

__all__ = ("Window",)

_timetick = attrgetter("timetick")


@final
class Window:
    """The keys of one ``Dedup`` (see the module docs). ``slots`` is the table, read
    and claimed into by ``Dedup`` directly on its hot paths (the dict is never
    replaced), for keys that ``runs`` does not hold (``get`` reads both); ``order`` may
    be replaced (``compact``), so it is read through here."""

    __slots__ = (
        "age_ticks",
        "forgotten_below",
        "held",
        "last_tick",
        "max_keys",
        "order",
        "runs",
        "slots",
        "stale",
    )

    def __init__(self, max_keys: int, age_ticks: int) -> None:
        self.max_keys = max_keys
        self.age_ticks = age_ticks
        #: The newest tick of the WAL (set when ``Dedup`` binds): eviction by age
        #: measures from it.
        self.last_tick: Callable[[], int] = lambda: 0
        self.slots: Table[Key, Slot] = ShardedDict()
        self.runs = Runs()
        # The keys and runs in the order they were claimed (or read, on open), the oldest
        # first, and how many entries of each key there are stale: one per release (a
        # released key may be claimed again later; its older entries come first). A
        # released run is marked dead instead.
        self.order: Queue[Key | Run] = KeyQueue(max_keys)
        self.stale: dict[Key, int] = {}
        # The keys a retry waits on (its owner's outcome), with how many wait: eviction
        # stops at them, so that a key settled while the window is past its bound is
        # still there for its waiters to read.
        self.held: dict[Key, int] = {}
        #: Every key settled with a timetick at or above this is in the window, if it
        #: was settled in the log at all: the window dropped (or, on open, never read)
        #: only keys below it. 0 until it drops one.
        self.forgotten_below = 0

    def __len__(self) -> int:
        return len(self.slots) + self.runs.keys

    def get(self, key: Key) -> Slot | None:
        """The slot of ``key``, from the table or a run; None if the window does not
        hold it."""
        slot = self.slots.get(key)
        if slot is None and self.runs:
            return self.runs.slot(key)
        return slot

    def note_settled(self, key: Key, result: AppendResult, txn: bool) -> bool:
        """Put a key read from the log into the window (the rebuild on open): ``key``
        settled with ``result``, by a transaction's CommitTxn if ``txn``. True if it
        added the key (a key the window holds keeps its first result)."""
        if self.get(key) is not None:
            return False
        slots = self.slots
        if txn:
            entry = slots[key] = Entry(None, True)
            entry.result = result
        else:
            slots[key] = result  # keyed appends wait for this: the window was empty
        self.order.append(key)
        return True

    # -- runs -----------------------------------------------------------------------------

    def claim_run(self, messages: Sequence[Message], floor: MessageId | None) -> Run | None:
        """Claim the keys of ``messages`` as one run under a new entry (``floor``), if
        they are a run (``counted_run``) of keys that are all new: numbered above every
        run of their stem and not in the table. Else claim nothing and return None."""
        run_of_keys = counted_run(messages)
        if run_of_keys is None:
            return None
        stem, first, vchannels = run_of_keys
        if first < self.runs.end(stem):
            return None  # a run of the stem may hold some: the caller sorts them out
        slots = self.slots
        if len(slots):
            keys: Sequence[Key] | None = window_keys(messages)  # None: a vchannel with NUL
            if keys is None:
                keys = [key_of(v, counted(stem, first + i)) for i, v in enumerate(vchannels)]
            if any(map(slots.__contains__, keys)):
                return None
        run = Run(stem, first, vchannels, Entry(floor, False))
        self.runs.add(run)
        self.order.append(run)
        return run

    def settle_run(self, run: Run, results: Sequence[AppendResult]) -> None:
        """Settle ``run``'s keys with their ``results`` (one per key, in order)."""
        run.results = tuple(results)  # a copy: the caller gets the list
        self.evict()

    def release_run(self, run: Run) -> None:
        """Forget the keys of ``run``, in flight (its append wrote nothing)."""
        self.runs.drop(run)  # its entry in order is skipped from here on

    def split_run(self, run: Run) -> list[Key]:
        """Move the keys of ``run``, in flight, into the table under its entry, and
        return them: for the look-ups of the table (an ambiguous outcome is resolved key
        by key)."""
        keys = run.keys()
        self.runs.drop(run)
        self.slots.update(zip(keys, repeat(run.entry)))
        self.order.extend(keys)
        return keys

    # -- keys -----------------------------------------------------------------------------

    def settle_all(
        self, keys: Sequence[Key], entry: Entry, results: Sequence[AppendResult]
    ) -> None:
        """Settle ``keys``, claimed under ``entry`` in the table, with their ``results``."""
        if entry.txn:
            (entry.result,) = results  # the window keeps the entry: it names a transaction
        else:
            # In C loops. Nothing replaced them meanwhile: only a key's owner settles or
            # releases it, a claim takes only a free key, and eviction skips keys in flight.
            self.slots.update(zip(keys, results, strict=True))
        self.evict()

    def hold(self, keys: Sequence[Key]) -> None:
        """Keep ``keys`` from eviction (until ``unhold``)."""
        held = self.held
        for key in keys:
            held[key] = held.get(key, 0) + 1

    def unhold(self, keys: Sequence[Key]) -> None:
        """Undo one ``hold`` of ``keys``."""
        held = self.held
        for key in keys:
            count = held[key]
            if count == 1:
                del held[key]
            else:
                held[key] = count - 1

    def release(self, key: Key, entry: Entry) -> None:
        """Forget ``key``, claimed under ``entry`` in the table (its append wrote
        nothing)."""
        slots = self.slots
        if slots.get(key) is entry:
            del slots[key]
            self.stale[key] = self.stale.get(key, 0) + 1  # its entry in order
            if len(self.order) > 2 * len(slots) + 1024:
                self._compact()

    def release_all(self, keys: Sequence[Key], entry: Entry) -> None:
        """``release`` each of ``keys``."""
        for key in keys:
            self.release(key, entry)

    def _compact(self) -> None:
        """Drop the stale entries of ``order``: many keys were released (appends that
        failed) while few settled, so that eviction did not reach them."""
        stale = self.stale
        kept: Queue[Key | Run] = KeyQueue(self.max_keys)
        for key in self.order:
            if type(key) is Run:
                if not key.dead:
                    kept.append(key)
                continue
            count = stale.get(key)
            if count is None:
                kept.append(key)
            elif count == 1:
                del stale[key]
            else:
                stale[key] = count - 1
        self.order = kept

    # -- eviction -------------------------------------------------------------------------

    def evict(self) -> None:
        """Drop the oldest settled keys beyond ``max_keys`` or older than ``age_ticks``."""
        horizon = self.last_tick() - self.age_ticks
        order = self.order
        while True:
            self._evict_keys(horizon)
            if not order or type(order[0]) is not Run or not self._evict_run(order[0], horizon):
                return

    def _evict_keys(self, horizon: int) -> None:
        """``evict`` up to the first run in ``order``."""
        window = self.slots
        order = self.order
        stale = self.stale
        max_keys = self.max_keys - self.runs.keys  # the table's share of the bound
        held = self.held
        if not stale and not held:  # the usual case: the settled keys first, in a C loop
            newest = evict_settled(order, window, max_keys, horizon, AppendResult)
            if newest >= self.forgotten_below:
                self.forgotten_below = newest + 1
        while order:
            key = order[0]
            if type(key) is Run:
                break
            if stale:
                count = stale.get(key)
                if count is not None:  # an entry of a key released since
                    order.popleft()
                    if count == 1:
                        del stale[key]
                    else:
                        stale[key] = count - 1
                    continue
            if held and key in held:
                break  # a retry waits to read it; the bound is met once it has
            if len(window) > max_keys:  # dropped unless in flight: one probe for both
                slot = window.pop(key)
                result = slot if type(slot) is AppendResult else slot.result  # type: ignore[union-attr]
                if result is not None:
                    order.popleft()
                    if result.timetick >= self.forgotten_below:
                        self.forgotten_below = result.timetick + 1
                    continue
                window[key] = slot  # in flight: the bound is met once it settles
                break
            slot = window[key]
            result = slot if type(slot) is AppendResult else slot.result  # type: ignore[union-attr]
            if result is None or result.timetick >= horizon:
                break  # in flight, or young enough
            order.popleft()
            del window[key]
            if result.timetick >= self.forgotten_below:
                self.forgotten_below = result.timetick + 1

    def _evict_run(self, run: Run, horizon: int) -> bool:
        """``evict`` for ``run``, the first in ``order``: drop its oldest keys beyond the
        bound or older than ``age_ticks``; True if it left ``order`` (gone whole, or
        dead), False if the bound is met or it must stay (in flight, or held)."""
        if run.dead:
            self.order.popleft()
            return True
        results = run.results
        if results is None:
            return False  # in flight: the bound is met once it settles
        held = self.held
        if held and any(self.runs.run_of(key) is run for key in held):
            return False  # a retry waits to read one of its keys
        start = run.start
        stop = min(len(results), start + max(0, len(self) - self.max_keys))
        while stop < len(results) and results[stop].timetick < horizon:
            stop += 1
        if stop > start:
            run.start = stop
            self.runs.keys -= stop - start
            newest = max(map(_timetick, results[start:stop]))  # a C loop
            if newest >= self.forgotten_below:
                self.forgotten_below = newest + 1
        if stop < len(results):
            return False
        self.order.popleft()
        self.runs.drop(run)
        return True
