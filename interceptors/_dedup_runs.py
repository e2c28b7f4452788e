"""Runs: the dedup window's compact form of a batch of counted keys.

A key is *counted* when it is a stem and a number (``_shards.counted_key``): a
``walsvc://`` client's producer keys (``~<producer>.<hex>``) and those of
``walsvc.producer_key`` (``<producer>#<decimal>``) are. A batch whose keys are one stem
counted up by one from each message to the next (a remote producer's ``append_many``, a
pipeline's batch) is held as one ``Run``: the stem, the first number, each message's
vchannel, the batch's ``Entry`` while it is in flight and its results once settled.
Claiming, settling and evicting it is a few steps per batch, where a slot per key was a
table insert, a table update and a table delete per message, most of them cache misses
in a window of 100k keys: about half of a node's CPU per remote ``append_many`` of 100.

A counted key's window key is still its vchannel and key: a run answers for a key only
on the vchannel it was appended to, so that it is the same window as the table's, in
another form. ``Runs`` finds a key's run by its stem and number. A key is in a run or in
the table, never both: a run is claimed only for numbers above the stem's runs and keys
the table does not hold, and the table claims only keys no run holds
(``Window.get`` reads both).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import final

import msgspec

from walsvc.core._message import AppendResult

from ._dedup_slots import Entry, Key, Slot, key_of
from ._shards import counted, counted_key, spans_hold

__all__ = ("Run", "Runs")


@final
class Run(msgspec.Struct, gc=False, eq=False):
    """The counted keys of one batch: ``counted(stem, first + i)`` on ``vchannels[i]``,
    claimed under ``entry``; ``results`` once settled. Its oldest ``start`` keys were
    evicted; ``dead`` once it is no longer the window's (released, or its keys moved to
    the table). Like ``Entry``, it is not tracked by the cycle collector (and is hashed
    by identity: the window's order is probed with it), so it must be in no reference
    cycle: the one through its entry's owner ends when that owner is done."""

    stem: str
    first: int
    vchannels: tuple[str, ...]
    entry: Entry
    results: tuple[AppendResult, ...] | None = None
    start: int = 0
    dead: bool = False

    @property
    def end(self) -> int:
        """The number after its last key's."""
        return self.first + len(self.vchannels)

    def slot(self, number: int, vchannel: str) -> Slot | None:
        """The slot of the key numbered ``number`` on ``vchannel``, if the run holds it."""
        i = number - self.first
        if not self.start <= i < len(self.vchannels) or self.vchannels[i] != vchannel:
            return None
        return self.entry if self.results is None else self.results[i]

    def keys(self) -> list[Key]:
        """The window keys it holds, in order."""
        stem, first = self.stem, self.first
        return [
            key_of(vchannel, counted(stem, first + i))
            for i, vchannel in enumerate(self.vchannels)
            if i >= self.start
        ]


@final
class Runs:
    """The window's runs by stem, each stem's in the order of their numbers (which is
    the order they were claimed in); ``keys`` counts the keys they hold."""

    __slots__ = ("by_stem", "keys", "spans")

    def __init__(self) -> None:
        self.by_stem: dict[str, list[Run]] = {}
        self.keys = 0
        #: Per stem, the numbers its runs span: [the first run's first, the last's end).
        self.spans: dict[str, tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_stem)

    def end(self, stem: str) -> int:
        """The number after the last key of ``stem``'s runs (0 if it has none)."""
        span = self.spans.get(stem)
        return 0 if span is None else span[1]

    def add(self, run: Run) -> None:
        """Hold ``run`` (numbered after every run of its stem)."""
        runs = self.by_stem.setdefault(run.stem, [])
        runs.append(run)
        self.spans[run.stem] = (runs[0].first, run.end)
        self.keys += len(run.vchannels)

    def drop(self, run: Run) -> None:
        """Forget ``run`` and the keys it still holds; it is dead from here on."""
        runs = self.by_stem[run.stem]
        runs.remove(run)  # usually the first: runs leave oldest first
        if runs:
            self.spans[run.stem] = (runs[0].first, runs[-1].end)
        else:
            del self.by_stem[run.stem], self.spans[run.stem]
        self.keys -= len(run.vchannels) - run.start
        run.dead = True

    def run_of(self, key: Key) -> Run | None:
        """The run that holds window key ``key``, if one does."""
        found = self._find(key)
        return None if found is None else found[0]

    def slot(self, key: Key) -> Slot | None:
        """The slot of window key ``key`` in a run, if one holds it."""
        found = self._find(key)
        return None if found is None else found[1]

    def _find(self, key: Key) -> tuple[Run, Slot] | None:
        if isinstance(key, str):
            vchannel, _, text = key.partition("\0")
        else:
            vchannel, text = key
        parsed = counted_key(text)
        if parsed is None:
            return None
        stem, number = parsed
        runs = self.by_stem.get(stem)
        if not runs:
            return None
        i = bisect_right(runs, number, key=_first) - 1
        if i < 0:
            return None
        slot = runs[i].slot(number, vchannel)
        return None if slot is None else (runs[i], slot)

    def any_of(self, keys: Sequence[Key]) -> bool:
        """True if a run holds one of ``keys``. A C loop first (``spans_hold``): the keys
        of a stem's runs span a range of numbers, and a new key is above it."""
        return spans_hold(keys, self.spans) and any(self._find(key) is not None for key in keys)


def _first(run: Run) -> int:
    return run.first
