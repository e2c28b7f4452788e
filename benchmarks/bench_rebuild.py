"""The dedup window's rebuild after reopening a busy log: how long a keyed append waits.

A streaming node's log is all keyed appends (each remote producer's ``~<id>.<hex>``), so
a node restarted after ``kill -9`` answers no append until its window is rebuilt. Here: a
file WAL of 100-byte messages written just now (``sync="none"``), in ``append_many`` of
100 counted producer keys, all of it younger than the window's ``max_age``; then
``open_wal`` read-write and one keyed append, timed (warm page cache). The baseline,
measured alternately in the same run: a read-only scanner decoding the whole log
(``DeliverPolicy.all()`` to the newest message), the cost of a rebuild that reads
everything ``max_age`` allows.

- ``track_first_keyed_append_vs_full_scan``: first keyed append after reopening / the
  full scan, best of three each, for logs of 0.5M and 2M messages (lower is better). The
  window (100,000 keys) is rebuilt from its newest stretch of log, so the time should not
  grow with the log.
- ``track_first_keyed_append``: the same reopen, seconds.

Run alone: ``python -m benchmarks.bench_rebuild`` prints both.
"""

from __future__ import annotations

import time
import timeit

import walsvc
from walsvc import DeliverPolicy, Message

from ._common import (
    PAYLOAD,
    VCHANNELS,
    close_loop,
    new_loop,
    note,
    remove_dir,
    scratch_dir,
    side_by_side,
)

SIZES = {"500k": 500_000, "2M": 2_000_000}
BATCH = 100
REPEATS = 3


async def build_log(url: str, messages: int) -> None:
    """``messages`` keyed messages, in batches of ``BATCH`` counted keys of one producer."""
    async with await walsvc.open_wal(url, "p0", sync="none") as wal:
        for first in range(0, messages, BATCH):
            await wal.append_many(
                [
                    Message(
                        payload=PAYLOAD,
                        vchannel=VCHANNELS[i % len(VCHANNELS)],
                        idempotency_key=f"~bench.{i:x}",
                    )
                    for i in range(first, first + BATCH)
                ]
            )


async def first_keyed_append(url: str) -> float:
    """Seconds from ``open_wal`` read-write to the answer of one new keyed append."""
    start = time.perf_counter()
    wal = await walsvc.open_wal(url, "p0")
    try:
        key = f"bench-{time.time_ns()}"
        await wal.append(Message(payload=b"first", vchannel="v0", idempotency_key=key))
        return time.perf_counter() - start
    finally:
        await wal.aclose()


async def full_scan(url: str) -> float:
    """Seconds to decode every message of the log through a read-only scanner."""
    start = time.perf_counter()
    async with await walsvc.open_wal(url, "p0", read_only=True) as wal:
        latest = await wal.latest_message_id()
        async with wal.read(DeliverPolicy.all()) as scanner:
            async for batch in scanner.batches():
                if batch[-1].message_id == latest:
                    break
    return time.perf_counter() - start


class FirstKeyedAppend:
    """A busy log reopened: the first keyed append against a scan of the whole log."""

    params = (list(SIZES),)
    param_names = ("messages",)
    timer = timeit.default_timer
    timeout = 900

    def setup(self, messages: str) -> None:
        self.scratch = scratch_dir("rebuild")
        self.url = f"file://{self.scratch}/log"
        self.loop = new_loop("uvloop")
        self.loop.run_until_complete(build_log(self.url, SIZES[messages]))
        self.loop.run_until_complete(first_keyed_append(self.url))  # imports, page cache

    def teardown(self, messages: str) -> None:
        close_loop(self.loop)
        remove_dir(self.scratch)

    def figures(self, messages: str) -> tuple[float, float]:
        """(best first keyed append, best full scan), seconds."""
        url = self.url
        full, first = side_by_side(
            self.loop, REPEATS, lambda: full_scan(url), lambda: first_keyed_append(url)
        )
        note(f"{messages}: full scan {full} s, first keyed append {first} s")
        return min(first), min(full)

    def track_first_keyed_append_vs_full_scan(self, messages: str) -> float:
        first, full = self.figures(messages)
        return first / full

    track_first_keyed_append_vs_full_scan.unit = "ratio"  # type: ignore[attr-defined]

    def track_first_keyed_append(self, messages: str) -> float:
        return self.figures(messages)[0]

    track_first_keyed_append.unit = "seconds"  # type: ignore[attr-defined]


def main() -> None:
    bench = FirstKeyedAppend()
    for messages in SIZES:
        bench.setup(messages)
        try:
            first, full = bench.figures(messages)
            print(
                f"{messages}: first keyed append {first:.3f} s, full scan {full:.3f} s,"
                f" ratio {first / full:.2f}"
            )
        finally:
            bench.teardown(messages)


if __name__ == "__main__":
    main()
