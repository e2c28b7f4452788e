"""The dedup window never holds the loop: keyed appends through a full window.

One producer awaits keyed ``append_many`` of 100 on a ``memory://`` WAL whose ``Dedup``
keeps ``max_keys`` keys (every key new: each append claims one and evicts the oldest),
while a monitor sleeps 1 ms at a time and records how late each wake-up is. The run
lasts until the window has turned over ``TURNS`` times (a CPython dict under this churn
rebuilds itself every one to two windows' worth of inserts). Beside it, the same run
with the window's table as one dict (what walsvc built without a C compiler has), the
baseline.

Figures: the longest stall, ms, with the sharded table (target, as issue 21's: <= 10 ms),
at the default 100k keys and at a million; the one-dict figures go to stderr. Measured
2026-11-29 (every configuration in one process, three runs): 100k keys 0.7-2.5 ms
sharded, 5-12 ms one dict; a million keys 3.4-6.7 ms on uvloop and 6.5-12.2 ms on
asyncio sharded, 216-240 ms one dict (390-583 ms when a collection of young objects fell
in its run: it read the records of the runs before, which none had promoted). The 27-55
ms that a million keys held the loop before were ``memory://``'s one list of records
growing by copies of itself, and the runs before's closed WALs, which lived on as
reference cycles.

Run alone: ``python -m benchmarks.bench_dedup_stall`` prints the figures.
"""

from __future__ import annotations

import asyncio
import time
import timeit
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import walsvc
from interceptors import Dedup, _dedup_window, default_chain
from walsvc import Message

from ._common import LOOPS, PAYLOAD, VCHANNELS, close_loop, new_loop, note

BATCH = 100
TURNS = 2.5
#: The monitor's sleep.
TICK = 0.001


@contextmanager
def _one_dict() -> Iterator[None]:
    """Windows made meanwhile keep their keys in one dict (the baseline)."""
    sharded = _dedup_window.ShardedDict
    _dedup_window.ShardedDict = dict  # type: ignore[misc]
    try:
        yield
    finally:
        _dedup_window.ShardedDict = sharded  # type: ignore[misc]


async def longest_stall(max_keys: int) -> float:
    """Seconds of the longest loop stall while the window turns over ``TURNS`` times."""
    wal = await walsvc.open_wal(
        f"memory://stall-{uuid.uuid4().hex[:6]}",
        "p0",
        interceptors=lambda: default_chain(dedup=Dedup(max_keys=max_keys), retry=False),
    )
    stalls: list[float] = []
    done = asyncio.Event()

    async def monitor() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(TICK)
            stalls.append(max(0.0, time.perf_counter() - before - TICK))

    watching = asyncio.get_running_loop().create_task(monitor())
    try:
        for first in range(0, int(max_keys * (1 + TURNS)), BATCH):
            await wal.append_many(
                [
                    Message(
                        payload=PAYLOAD,
                        vchannel=VCHANNELS[i % len(VCHANNELS)],
                        idempotency_key=f"~p.bench.{i}",
                    )
                    for i in range(first, first + BATCH)
                ]
            )
            await asyncio.sleep(0)  # the monitor's turn, as other work in a service has
    finally:
        done.set()
        await watching
        await wal.aclose()
    return max(stalls)


class DedupStall:
    """The longest loop stall through a full dedup window, ms."""

    params = (list(LOOPS), [100_000, 1_000_000])
    param_names = ("loop", "max_keys")
    timer = timeit.default_timer
    timeout = 300
    unit = "ms"

    def setup(self, loop: str, max_keys: int) -> None:
        self.loop = new_loop(loop)

    def teardown(self, loop: str, max_keys: int) -> None:
        close_loop(self.loop)

    def track_longest_stall_ms(self, loop: str, max_keys: int) -> float:
        sharded = self.loop.run_until_complete(longest_stall(max_keys))
        with _one_dict():
            one_dict = self.loop.run_until_complete(longest_stall(max_keys))
        note(
            f"dedup window of {max_keys} keys: longest stall {sharded * 1000:.1f} ms"
            f" (one dict: {one_dict * 1000:.1f} ms)"
        )
        return sharded * 1000


def main() -> None:
    """Every figure once per loop, on stderr (``[walsvc-bench]`` lines) and stdout."""
    for loop in LOOPS:
        for max_keys in DedupStall.params[1]:
            bench = DedupStall()
            bench.setup(loop, max_keys)
            try:
                figure = bench.track_longest_stall_ms(loop, max_keys)
                print(f"{loop} max_keys={max_keys} track_longest_stall_ms: {figure:.1f}")
            finally:
                bench.teardown(loop, max_keys)


if __name__ == "__main__":
    main()
