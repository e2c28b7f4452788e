"""Timetick allocation: hybrid timestamps, physical milliseconds << 18 | a logical counter.

Ticks are handed out at the WAL's serialization point (the same event-loop step that
queues the record for the backend), so log order equals timetick order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Protocol, final

__all__ = ("LOGICAL_BITS", "HybridClock", "TimetickAllocator", "physical_ms", "span_of_ms")

#: Bits of a timetick below the physical milliseconds.
LOGICAL_BITS: Final = 18


def physical_ms(timetick: int) -> int:
    """The wall-clock milliseconds part of a hybrid timetick."""
    return timetick >> LOGICAL_BITS


def span_of_ms(milliseconds: int) -> int:
    """How far apart two timeticks ``milliseconds`` of wall clock apart are."""
    return milliseconds << LOGICAL_BITS


class TimetickAllocator(Protocol):
    """Hands out timeticks. One allocator may serve many pchannels."""

    def allocate(self) -> int:
        """A tick greater than every tick this allocator returned or observed before."""
        ...

    def observe(self, timetick: int) -> None:
        """Make every later ``allocate()`` return more than ``timetick`` (used on open, with
        the newest tick recovered from the log)."""
        ...


@final
class HybridClock:
    """The default in-process allocator: ``physical_ms << 18 | logical``, strictly
    increasing even if the wall clock steps back; ``now_ms`` is injectable for tests."""

    __slots__ = ("_last", "_now_ms")

    def __init__(self, now_ms: Callable[[], int] | None = None) -> None:
        self._now_ms = now_ms
        self._last = 0

    def allocate(self) -> int:
        """A tick above every earlier one: ``now_ms << 18``, or the last tick + 1."""
        now_ms = self._now_ms
        # The default clock is inlined: allocate() runs once per appended message.
        tick = (now_ms() if now_ms else _time_ns() // 1_000_000) << LOGICAL_BITS
        if tick <= self._last:
            tick = self._last + 1
        self._last = tick
        return tick

    def allocate_many(self, count: int) -> int:
        """The first of ``count`` consecutive ticks above every earlier one: what
        ``count`` calls of ``allocate`` within one millisecond give, in one call (the WAL
        uses it for a batch, when an allocator offers it)."""
        now_ms = self._now_ms
        tick = (now_ms() if now_ms else _time_ns() // 1_000_000) << LOGICAL_BITS
        if tick <= self._last:
            tick = self._last + 1
        self._last = tick + count - 1
        return tick

    def observe(self, timetick: int) -> None:
        """Keep every later tick above ``timetick``."""
        if timetick > self._last:
            self._last = timetick


_time_ns = time.time_ns
