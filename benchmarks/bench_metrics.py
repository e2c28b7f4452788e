"""What metrics cost: 64 producers on an embedded ``file://`` WAL with ``sync="always"``,
with ``walsvc.metrics`` on over the same with it off, side by side in one run (issue 24:
>= 0.97x).

Each measure opens a fresh pchannel after turning recording on or off (a WAL records
only if metrics were on when it opened) and scrapes the registry once at the end, as
Prometheus would, so the collectors run too.

Run alone: ``python -m benchmarks.bench_metrics`` prints the figures.
"""

from __future__ import annotations

import timeit
import uuid

from prometheus_client import CollectorRegistry, generate_latest

import walsvc
import walsvc.metrics
from walsvc import Message

from ._common import (
    LOOPS,
    PAYLOAD,
    PRODUCERS,
    VCHANNELS,
    close_loop,
    closed_loop_rate,
    new_loop,
    note,
    paired_ratio,
    remove_dir,
    scratch_dir,
    side_by_side,
)

#: Longer runs and more rounds than the suite's default: the cost measured is a few
#: percent, under a 1 s run's noise here. Each round measures metrics off twice and on
#: once, back to back; the figure is the median of the rounds' on/off ratios
#: (``paired_ratio``), and the off/off ratio (A/A), printed beside it, is the run's own
#: noise floor.
SECONDS = 1.0
WARMUP = 0.2
REPEATS = 9


async def _rate(directory: str, registry: CollectorRegistry | None) -> float:
    """Messages/s of 64 producers on a fresh pchannel, with metrics on and exported
    through ``registry`` (scraped once at the end), or off (None)."""
    if registry is not None:
        walsvc.metrics.enable(registry)
    try:
        wal = await walsvc.open_wal(
            f"file://{directory}", f"p-{uuid.uuid4().hex[:8]}", sync="always"
        )
        try:

            async def operation(i: int) -> object:
                message = Message(payload=PAYLOAD, vchannel=VCHANNELS[i % len(VCHANNELS)])
                return await wal.append(message)

            await closed_loop_rate(operation, producers=PRODUCERS, seconds=WARMUP)
            rate = await closed_loop_rate(operation, producers=PRODUCERS, seconds=SECONDS)
            if registry is not None:  # the scrape: what was counted is there
                assert b"walsvc_appended_messages_total" in generate_latest(registry)
            return rate
        finally:
            await wal.aclose()
    finally:
        if registry is not None:
            walsvc.metrics.disable(registry)


class MetricsCost:
    """64-producer file appends, metrics on over metrics off."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 180
    unit = "ratio"

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)
        self.directory = scratch_dir("metrics")

    def teardown(self, loop: str) -> None:
        try:
            close_loop(self.loop)
        finally:
            remove_dir(self.directory)

    def track_append_64_producers_metrics_ratio(self, loop: str) -> float:
        registry = CollectorRegistry()
        off, off_again, on = side_by_side(
            self.loop,
            REPEATS,
            lambda: _rate(self.directory, None),
            lambda: _rate(self.directory, None),
            lambda: _rate(self.directory, registry),
        )
        what = "64 producers, file:// sync=always"
        note(f"{what}: metrics off {[round(r) for r in off]} msgs/s")
        note(f"{what}: metrics off again {[round(r) for r in off_again]} msgs/s")
        note(f"{what}: metrics on {[round(r) for r in on]} msgs/s")
        note(f"{what}: A/A (off again / off) {paired_ratio(off, off_again):.3f}")
        return paired_ratio(off, on)


def main() -> None:
    """Every figure once per loop, on stderr (``[walsvc-bench]`` lines), ratios on stdout."""
    for loop in LOOPS:
        bench = MetricsCost()
        bench.setup(loop)
        try:
            ratio = bench.track_append_64_producers_metrics_ratio(loop)
            print(f"{loop} track_append_64_producers_metrics_ratio: {ratio:.3f}", flush=True)
        finally:
            bench.teardown(loop)


if __name__ == "__main__":
    main()
