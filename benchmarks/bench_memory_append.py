"""Appends to the memory WAL: the cost of walsvc's own append path with no I/O.

The baseline is the asyncio hand-off alone (``RawGroupCommitLog(None)``): 64 producers
hand (record, future) to one writer task that drains the queue into a list and resolves
the futures (performance.md: 0.48-0.56M/s on asyncio, 0.85-0.94M/s on uvloop).

Target (issue 2): 64 concurrent producers >= 300k msgs/s.
"""

from __future__ import annotations

import asyncio
import itertools
import timeit
from collections.abc import Awaitable

import walsvc
from walsvc import AppendResult, Message

from ._common import (
    LOOPS,
    PAYLOAD,
    PRODUCERS,
    VCHANNELS,
    RawGroupCommitLog,
    close_loop,
    closed_loop_rate,
    new_loop,
    note,
    side_by_side,
)

SECONDS = 0.5
WARMUP = 0.1
REPEATS = 3

_names = itertools.count()


async def walsvc_rate() -> float:
    """Messages/s of 64 producers each awaiting ``append`` on a fresh memory WAL."""
    wal = await walsvc.open_wal(f"memory://bench-{next(_names)}", "p0")
    try:

        def append_one(i: int) -> Awaitable[AppendResult]:
            return wal.append(Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]))

        await closed_loop_rate(append_one, producers=PRODUCERS, seconds=WARMUP)
        return await closed_loop_rate(append_one, producers=PRODUCERS, seconds=SECONDS)
    finally:
        # Memory logs live as long as the process: drop the records.
        last = await wal.latest_message_id()
        if last is not None:
            await wal.truncate(last)
        await wal.aclose()


async def raw_rate() -> float:
    """Records/s of 64 producers through the bare asyncio hand-off (no I/O)."""
    log = RawGroupCommitLog(None)
    try:

        def append(i: int) -> asyncio.Future[None]:
            return log.append(PAYLOAD)

        await closed_loop_rate(append, producers=PRODUCERS, seconds=WARMUP)
        return await closed_loop_rate(append, producers=PRODUCERS, seconds=SECONDS)
    finally:
        await log.aclose()


class _MemoryAppend:
    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 60

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)

    def teardown(self, loop: str) -> None:
        close_loop(self.loop)


class MemoryAppendRate(_MemoryAppend):
    """Absolute throughput, best of three runs."""

    unit = "msgs/s"

    def track_append_64_producers(self, loop: str) -> float:
        """walsvc memory WAL, 64 producers each awaiting its own append (target >= 300k)."""
        (rates,) = side_by_side(self.loop, REPEATS, walsvc_rate)
        return max(rates)

    def track_raw_handoff_64_producers(self, loop: str) -> float:
        """Baseline: the bare asyncio (record, future) hand-off to one writer task."""
        (rates,) = side_by_side(self.loop, REPEATS, raw_rate)
        return max(rates)


class MemoryAppendRatio(_MemoryAppend):
    """walsvc memory WAL over the bare hand-off, alternately, best of three each."""

    unit = "ratio"

    def track_append_64_producers_ratio(self, loop: str) -> float:
        raw, wal = side_by_side(self.loop, REPEATS, raw_rate, walsvc_rate)
        note(f"raw {[round(r) for r in raw]} walsvc {[round(r) for r in wal]} msgs/s")
        return max(wal) / max(raw)
