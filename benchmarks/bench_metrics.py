"""What metrics cost: 64 producers on an embedded ``file://`` WAL with ``sync="always"``,
with ``walsvc.metrics`` on over the same with it off, side by side in one run (issue 24:
>= 0.97x).

Each measure opens a fresh pchannel after turning recording on or off (a WAL records
only if metrics were on when it opened) and scrapes the registry once at the end, as
Prometheus would, so the collectors run too. Beside the rates it prints the event loop
thread's CPU per message (``time.thread_time``) on over off, with its own A/A: the cost
as loop work, apart from the disk's latency (which moves the rate too). Its A/A spread
here is about as wide as the rate's (0.99-1.03 in the first runs).

Run alone: ``python -m benchmarks.bench_metrics`` prints the figures.
"""

from __future__ import annotations

import time
import timeit
import uuid
from typing import NamedTuple

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
REPEATS = 15


class _Measure(NamedTuple):
    rate: float  #: messages/s
    loop_cpu: float  #: seconds of the event loop thread's CPU per message


async def _measure(directory: str, registry: CollectorRegistry | None) -> _Measure:
    """64 producers on a fresh pchannel, with metrics on and exported through
    ``registry`` (scraped once at the end), or off (None)."""
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
            wall, cpu = time.perf_counter(), time.thread_time()
            rate = await closed_loop_rate(operation, producers=PRODUCERS, seconds=SECONDS)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            if registry is not None:  # the scrape: what was counted is there
                assert b"walsvc_appended_messages_total" in generate_latest(registry)
            return _Measure(rate, cpu / wall / rate)
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
        measured = side_by_side(
            self.loop,
            REPEATS,
            lambda: _measure(self.directory, None),
            lambda: _measure(self.directory, None),
            lambda: _measure(self.directory, registry),
        )
        (off, off_again, on), (cpu_off, cpu_off_again, cpu_on) = (
            [[m.rate for m in ms] for ms in measured],
            [[m.loop_cpu for m in ms] for ms in measured],
        )
        what = "64 producers, file:// sync=always"
        note(f"{what}: metrics off {[round(r) for r in off]} msgs/s")
        note(f"{what}: metrics off again {[round(r) for r in off_again]} msgs/s")
        note(f"{what}: metrics on {[round(r) for r in on]} msgs/s")
        note(f"{what}: A/A (off again / off) {paired_ratio(off, off_again):.3f}")
        note(
            f"{what}: loop CPU per message, off {[round(c * 1e9) for c in cpu_off]} ns,"
            f" on {[round(c * 1e9) for c in cpu_on]} ns; on/off"
            f" {paired_ratio(cpu_off, cpu_on):.3f} (A/A {paired_ratio(cpu_off, cpu_off_again):.3f})"
        )
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
