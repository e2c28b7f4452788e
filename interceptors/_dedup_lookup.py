"""Dedup's answers for keys whose outcome is not at hand in its window.

``KeyLookup`` tells what a key settled with when the window alone cannot:

- a key in flight: its owner's outcome is waited for (not its caller's);
- a blocked key (an ambiguous append whose log read failed): the log is read again, by
  this retry as the key's owner, and the key is settled or released;
- an ambiguous append (``AppendOutcomeUnknown``): its keys are looked up in the log from
  the owner's last-confirmed id, in one read; found ones are settled, missing ones
  released, and if the log cannot be read they stay blocked;
- a recall (a reconnecting producer's): keys the window may have dropped are looked up
  in the stretch of log it forgot, and put back.

It changes the window only as ``Window`` allows (settle, release, put back a settled
key); ``Dedup`` claims keys and decides who owns them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import final

from walsvc.core._chain import InterceptorContext
from walsvc.core._errors import AppendOutcomeUnknown, InvalidArgument, WALError
from walsvc.core._message import AppendResult

from ._dedup_slots import Entry, Key, named
from ._dedup_window import Window
from ._key_search import find_keys, find_keys_since

__all__ = ("KeyLookup", "kind_mismatch")

#: Runs the append (here: the log read) that settles an entry's keys as their owner.
Own = Callable[[Entry, Awaitable[None]], Awaitable[None]]


@final
class KeyLookup:
    """The look-ups of one ``Dedup`` (see the module docs): its window ``keys``, the
    WAL's context (``bound``, once bound) and its way to own an entry (``own``)."""

    __slots__ = ("_bound", "_keys", "_own")

    def __init__(self, keys: Window, bound: Callable[[], InterceptorContext], own: Own) -> None:
        self._keys = keys
        self._bound = bound
        self._own = own

    async def settled(self, key: Key, txn: bool) -> AppendResult | None:
        """The result ``key`` settled with (``txn``: a transaction's key); None if it is
        free. Waits for its owner if it is in flight; reads the log once more if it is
        blocked, and raises ``AppendOutcomeUnknown`` if that still cannot tell;
        ``InvalidArgument`` if the key names the other kind. The caller holds ``key``
        from eviction."""
        retried = False
        while True:
            slot = self._keys.get(key)
            if slot is None:
                return None
            if isinstance(slot, AppendResult):
                if txn:
                    raise kind_mismatch(key, False)
                return slot
            if slot.result is not None:
                if slot.txn != txn:
                    raise kind_mismatch(key, slot.txn)
                return slot.result
            owner = slot.owner
            if owner is not None and not owner.done():
                await asyncio.wait((owner,))  # the owner's outcome, not its caller's
            elif retried:
                raise AppendOutcomeUnknown(
                    f"whether the append of key {named(key)} landed is"
                    " still unknown: the log could not be read to tell, so the key stays"
                    " blocked (each retry reads it again)"
                )
            else:  # blocked: read the log again, as this retry's owner
                retried = True
                try:
                    await self._own(slot, self._resolve_again(key, slot))
                except AppendOutcomeUnknown:
                    pass  # still blocked: said above, on the next turn

    async def _resolve_again(self, key: Key, entry: Entry) -> None:
        """``resolve`` for a blocked key: settled or released (free to append), unless
        the log still cannot be read (raises ``AppendOutcomeUnknown``)."""
        unknown = AppendOutcomeUnknown(f"the append of key {named(key)} may have landed")
        try:
            await self.resolve(key, entry, unknown)
        except AppendOutcomeUnknown as exc:
            if exc is not unknown:
                raise

    async def resolve(self, key: Key, entry: Entry, error: AppendOutcomeUnknown) -> AppendResult:
        """Find whether the ambiguous append of ``key`` landed: settle it (found) or
        release it and raise ``error`` (not found). If the log cannot be read, the key
        stays blocked and ``AppendOutcomeUnknown`` says so."""
        (outcome,) = await self.resolve_all((key,), entry, error)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def resolve_all(
        self, keys: Sequence[Key], entry: Entry, error: AppendOutcomeUnknown
    ) -> list[AppendResult | AppendOutcomeUnknown]:
        """``resolve`` for the keys of one ambiguous append (claimed under ``entry``), with
        one read of the log: per key, its result (found: settled), ``error`` (not found:
        released), or a new ``AppendOutcomeUnknown`` saying it stays blocked (the log could
        not be read)."""
        try:
            found = await find_keys(self._bound(), set(keys), entry.floor)
        except (WALError, OSError) as exc:
            blocked: list[AppendResult | AppendOutcomeUnknown] = []
            for key in keys:
                unknown = AppendOutcomeUnknown(
                    f"{error}; and reading the log to resolve key {named(key)} failed ({exc!r}):"
                    " the key stays blocked until the log can be read to tell (each retry"
                    " reads it again)"
                )
                unknown.__cause__ = error
                blocked.append(unknown)
            return blocked
        outcomes: list[AppendResult | AppendOutcomeUnknown] = []
        for key in keys:
            result = found.get(key)
            if result is None:
                self._keys.release(key, entry)
                outcomes.append(error)
            else:
                self._keys.settle_all((key,), entry, (result,))
                outcomes.append(result)
        return outcomes

    async def recall(self, wanted: Sequence[Key], since_tick: int) -> list[AppendResult | None]:
        """``Dedup.recall`` of the window keys ``wanted``, which the caller holds from
        eviction (and evicts after): from the window, and for a key it may have dropped,
        from the stretch of log it forgot (one read, ending once every key is found)."""
        results = [await self.settled(key, False) for key in wanted]
        missing = {key for key, result in zip(wanted, results, strict=True) if not result}
        forgotten_below = self._keys.forgotten_below
        if not missing or since_tick >= forgotten_below:
            return results  # the window holds every key settled since then
        # A missing key settled, if at all, below forgotten_below (at and above it, the
        # window holds every settled key): only that stretch is read. It is at most a
        # settled key's tick + 1, and the newest message in the log has a tick at least
        # that: the read reaches its end.
        found = await find_keys_since(self._bound(), missing, since_tick, forgotten_below)
        window = self._keys.slots
        for key, result in found.items():
            if self._keys.get(key) is None:  # else claimed meanwhile: the claim stays
                window[key] = result
                self._keys.order.append(key)
        # a key asked twice is answered twice
        return [r if r is not None else found.get(k) for k, r in zip(wanted, results, strict=True)]


def kind_mismatch(key: Key, names_txn: bool) -> InvalidArgument:
    """The error for a key used for the other kind (``names_txn``: it names a
    transaction)."""
    kind = "a transaction" if names_txn else "a message"
    return InvalidArgument(
        f"idempotency key {named(key)} already names {kind}; a key"
        " names one message or one transaction"
    )
