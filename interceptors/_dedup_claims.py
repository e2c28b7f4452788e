"""The appends that settle claimed keys: what ``Dedup`` does once it owns keys.

A *claim* is the keys one append owns in the window: keys of its table under one
``Entry`` (``TableClaim``), or a run of counted keys (``RunClaim``, see ``_dedup_runs``).
``ClaimedAppends`` appends the claim's messages and settles the claim from the outcome,
the same way whatever the claim's form:

- appended: every key is settled with its message's result;
- refused before writing (any other error): the claim is released, so a retry owns its
  keys again;
- ambiguous (``AppendOutcomeUnknown``): the keys are looked up in the log
  (``KeyLookup``): found ones are settled, the rest released, or all stay blocked if
  the log cannot be read.

It has two forms of the same appends: ``append_batch`` for one caller's batch
(``WAL.append_many``), which raises, and ``append_coalesced`` for concurrent callers'
appends gathered into one batch, which returns each caller's own outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, final

from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.core._errors import AppendOutcomeUnknown, MessageTooLarge
from walsvc.core._message import AppendResult, Message

from ._dedup_lookup import KeyLookup
from ._dedup_runs import Run
from ._dedup_slots import Entry, Key
from ._dedup_window import Window

__all__ = ("Claim", "ClaimedAppends", "RunClaim", "TableClaim")


class Claim(Protocol):
    """Keys one append owns in the window, settled or released together."""

    def settle(self, window: Window, results: Sequence[AppendResult]) -> None:
        """Settle each key with its message's result (in the claim's order)."""

    def release(self, window: Window) -> None:
        """Free every key: nothing was written."""

    def unresolved(self, window: Window) -> tuple[list[Key], Entry]:
        """The keys, in the table under their entry, to be looked up one by one (the
        outcome is unknown)."""


@final
class TableClaim:
    """``keys`` claimed in the window's table under ``entry``."""

    __slots__ = ("entry", "keys")

    def __init__(self, keys: list[Key], entry: Entry) -> None:
        self.keys = keys
        self.entry = entry

    def settle(self, window: Window, results: Sequence[AppendResult]) -> None:
        """Settle each key with its message's result."""
        window.settle_all(self.keys, self.entry, results)

    def release(self, window: Window) -> None:
        """Free every key."""
        window.release_all(self.keys, self.entry)

    def unresolved(self, window: Window) -> tuple[list[Key], Entry]:
        """The keys, already in the table."""
        return self.keys, self.entry


@final
class RunClaim:
    """A run of counted keys claimed as one (``Window.claim_run``)."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        self.run = run

    def settle(self, window: Window, results: Sequence[AppendResult]) -> None:
        """Settle the run as one."""
        window.settle_run(self.run, results)

    def release(self, window: Window) -> None:
        """Free the run."""
        window.release_run(self.run)

    def unresolved(self, window: Window) -> tuple[list[Key], Entry]:
        """The run's keys, moved into the table under the run's entry."""
        return window.split_run(self.run), self.run.entry


@final
class ClaimedAppends:
    """Appends of claimed keys, settled from their outcome in ``window``; ambiguous
    ones are resolved by ``lookup`` (see the module's docstring)."""

    __slots__ = ("_lookup", "_window")

    def __init__(self, window: Window, lookup: KeyLookup) -> None:
        self._window = window
        self._lookup = lookup

    async def append_one(
        self, key: Key, entry: Entry, message: Message, call_next: AppendNext
    ) -> AppendResult:
        """Append ``message``, whose ``key`` is claimed under ``entry``; its result, or
        its error (``AppendOutcomeUnknown`` only if the log does not show it landed)."""
        try:
            result = await call_next(message)
        except AppendOutcomeUnknown as exc:
            return await self._lookup.resolve(key, entry, exc)
        except BaseException:
            self._window.release(key, entry)  # nothing was written
            raise
        self._window.settle_all((key,), entry, (result,))
        return result

    async def append_batch(
        self,
        claim: Claim,
        batch: list[Message],
        call_next: AppendBatchNext,
        claimed: Sequence[Key | None] | None = None,
    ) -> list[AppendResult]:
        """Append ``batch`` (one caller's) whole and settle ``claim``, the keys of its
        messages; ``claimed`` gives each message's key, or None for a message without
        one, when not every message has a key of the claim. The results, or an error:
        ``AppendOutcomeUnknown`` unless the log shows that every keyed message landed."""
        window = self._window
        try:
            appended = await _append_whole(batch, call_next)
        except AppendOutcomeUnknown as exc:
            keys, entry = claim.unresolved(window)
            return await self._resolve_batch(keys if claimed is None else claimed, keys, entry, exc)
        except BaseException:
            claim.release(window)  # nothing was written
            raise
        if claimed is None:
            claim.settle(window, appended)
        else:
            claim.settle(
                window, [r for k, r in zip(claimed, appended, strict=True) if k is not None]
            )
        return appended

    async def append_coalesced(
        self, claim: Claim, batch: list[Message], call_next: AppendBatchNext
    ) -> Sequence[AppendResult | Exception | None]:
        """Append ``batch`` (concurrent callers' appends, every message's key in
        ``claim``) and settle ``claim``; return what each caller gets: its result, its
        error, or None (the batch was refused as too large: each message tries again
        alone, so that only that one fails)."""
        window = self._window
        try:
            appended = await _append_whole(batch, call_next)
        except AppendOutcomeUnknown as exc:
            keys, entry = claim.unresolved(window)
            return await self._lookup.resolve_all(keys, entry, exc)
        except MessageTooLarge:
            claim.release(window)  # nothing was written: each tries again alone
            return [None] * len(batch)
        except BaseException as exc:
            claim.release(window)  # nothing was written
            if not isinstance(exc, Exception):
                raise
            return [exc] * len(batch)
        claim.settle(window, appended)
        return appended

    async def _resolve_batch(
        self,
        claimed: Sequence[Key | None],
        keys: Sequence[Key],
        entry: Entry,
        error: AppendOutcomeUnknown,
    ) -> list[AppendResult]:
        """The results of a batch whose append ended in ``error``, if the log shows that
        every keyed message of it landed (``claimed``: each message's key, or None;
        ``keys``: the keys, under ``entry``). Each key is looked up in the log: found
        ones are settled, the rest released, and ``error`` is raised (a retry appends
        what is missing and is answered for the rest); if the log cannot be read, the
        keys stay blocked and that is raised."""
        resolved = iter(await self._lookup.resolve_all(keys, entry, error))
        found = [None if key is None else next(resolved) for key in claimed]
        for outcome in found:
            if isinstance(outcome, Exception) and outcome is not error:
                raise outcome from error  # the log could not be read: the keys stay blocked
        if any(not isinstance(outcome, AppendResult) for outcome in found):
            raise error
        return [r for r in found if isinstance(r, AppendResult)]


async def _append_whole(batch: list[Message], call_next: AppendBatchNext) -> list[AppendResult]:
    """``call_next(batch)``: a result per message, or ``AppendOutcomeUnknown`` if the chain
    returned another count (what of the batch landed is not known)."""
    appended = await call_next(batch)
    if len(appended) != len(batch):
        raise AppendOutcomeUnknown(
            f"the interceptor chain returned {len(appended)} results for a batch of"
            f" {len(batch)} appends; they may or may not be in the log"
        )
    return appended
