"""The dedup window: which keys are known, what each holds, and the order they leave in.

``Window`` is the bookkeeping under ``Dedup``: a table from window key to slot (a settled
message key's ``AppendResult``, or an ``Entry``: in flight, blocked, or a settled
transaction key), the keys in the order they were claimed (or read, on open), the
stale entries of that order (one per release: a released key may be claimed again), and
the keys a retry waits on (held: eviction stops at them). ``evict`` drops the oldest
settled keys beyond ``max_keys`` or older than ``age_ticks``; it never drops a key in
flight or held, and it notes the newest tick it dropped (``forgotten_below``): below
that tick, a key missing from the window may still be in the log. Nothing here awaits:
``Dedup`` decides who claims, settles and releases, and this keeps the window true to
it. The table is a ``ShardedDict`` (``_shards``): a
dict in shards, so that a rebuild under churn holds the loop for one shard, not the
window; the order is a ``KeyQueue``, which the cycle collector does not read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, final

import msgspec

from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, MessageType

from ._shards import KeyQueue, Queue, ShardedDict, Table, evict_settled

__all__ = (
    "Entry",
    "Key",
    "Slot",
    "Window",
    "in_flight",
    "key_of",
    "named",
    "result_of",
    "settled_key",
)

#: A key of the window: ``vchannel + "\0" + idempotency key`` (no NUL in the vchannel: the
#: first NUL ends it), else the tuple (vchannel, idempotency key). A str is hashed once and
#: is no work for the cycle collector, which a tuple per key kept in the window was.
Key = str | tuple[str, str]


@final
class Entry(msgspec.Struct, gc=False):
    """A key of the window that is not a settled message key: in flight (``owner``
    running), blocked (no ``owner``, no ``result``: its outcome could not be read), or a
    settled transaction key (``result``, ``txn``). The keys of one batch share one.

    Neither it nor an ``AppendResult`` is tracked by the cycle collector, so the
    window's table, which holds only them and str keys, is never tracked either: a
    collection does not read a window of a million keys. In return it must be in no
    reference cycle: its owner, whose coroutine refers to it, is dropped once done
    (``drop_owner``)."""

    #: At or before where the keyed messages land: resolution reads from here.
    floor: MessageId | None
    #: True if the key names a transaction (settled by its CommitTxn).
    txn: bool
    result: AppendResult | None = None
    #: The append that settles the keys, while it runs.
    owner: asyncio.Future[Any] | None = None

    def drop_owner(self, owner: asyncio.Future[Any]) -> None:
        """Forget ``owner``, done, unless another owns the keys since."""
        if self.owner is owner:
            self.owner = None


#: What the window holds per key: a settled message key's result (most keys), or an
#: ``Entry``.
Slot = AppendResult | Entry


@final
class Window:
    """The keys of one ``Dedup`` (see the module docs). ``slots`` is the window itself,
    read and claimed into by ``Dedup`` directly on its hot paths (the dict is never
    replaced); ``order`` may be replaced (``compact``), so it is read through here."""

    __slots__ = (
        "age_ticks",
        "forgotten_below",
        "held",
        "last_tick",
        "max_keys",
        "order",
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
        # The keys in the order they were claimed (or read, on open), the oldest first, and
        # how many entries of each key there are stale: one per release (a released key
        # may be claimed again later; its older entries come first).
        self.order: Queue[Key] = KeyQueue(max_keys)
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
        return len(self.slots)

    def note_settled(self, message: ImmutableMessage) -> bool:
        """Put a keyed message read from the log into the window (the rebuild on open);
        True if it added a key."""
        key = settled_key(message)
        slots = self.slots
        if key is None or key in slots:
            return False
        result = result_of(message)
        if message.txn is None:
            slots[key] = result  # keyed appends wait for this: the window was empty
        else:
            entry = slots[key] = Entry(None, True)
            entry.result = result
        self.order.append(key)
        if len(slots) > self.max_keys:
            self.evict()  # one key at a time, not the excess of a whole window at the end
        return True

    def settle_all(
        self, keys: Sequence[Key], entry: Entry, results: Sequence[AppendResult]
    ) -> None:
        """Settle ``keys``, claimed under ``entry``, with their ``results``."""
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
        """Forget ``key``, claimed under ``entry`` (its append wrote nothing)."""
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
        kept: Queue[Key] = KeyQueue(self.max_keys)
        for key in self.order:
            count = stale.get(key)
            if count is None:
                kept.append(key)
            elif count == 1:
                del stale[key]
            else:
                stale[key] = count - 1
        self.order = kept

    def evict(self) -> None:
        """Drop the oldest settled keys beyond ``max_keys`` or older than ``age_ticks``."""
        window = self.slots
        order = self.order
        stale = self.stale
        horizon = self.last_tick() - self.age_ticks
        max_keys = self.max_keys
        held = self.held
        if not stale and not held:  # the usual case: the settled keys first, in a C loop
            newest = evict_settled(order, window, max_keys, horizon, AppendResult)
            if newest >= self.forgotten_below:
                self.forgotten_below = newest + 1
        while order:
            key = order[0]
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


def in_flight(slot: Slot) -> bool:
    """True for a key whose append is in flight or blocked (no result yet)."""
    return type(slot) is Entry and slot.result is None


def settled_key(message: ImmutableMessage) -> Key | None:
    """The window key a message in the log settles: a keyed message outside
    transactions, or a transaction's CommitTxn."""
    key = message.idempotency_key
    if key is None or (message.txn is not None and message.type is not MessageType.COMMIT_TXN):
        return None
    return key_of(message.vchannel, key)


def key_of(vchannel: str, key: str) -> Key:
    """The window key of idempotency key ``key`` on ``vchannel``."""
    return f"{vchannel}\0{key}" if "\0" not in vchannel else (vchannel, key)


def named(key: Key) -> str:
    """A window key as error messages name it: the key, then its vchannel."""
    vchannel, key_text = key.split("\0", 1) if isinstance(key, str) else key
    return f"{key_text!r} on vchannel {vchannel!r}"


def result_of(message: ImmutableMessage) -> AppendResult:
    """The ``AppendResult`` an append of ``message`` returned."""
    return AppendResult(message.message_id, message.timetick, message.last_confirmed_id)
