"""Durable appends: the file WAL with ``sync="always"`` against raw group commit.

The baseline (``RawGroupCommitLog``) is the physical limit of this design on this disk:
one writer task drains every queued 100-byte record, does one ``os.write`` and one
``os.fdatasync`` in one worker thread, then resolves the producers' futures; no envelope,
no ids. Ratios run both side by side in one process, alternately, best of three each.

Targets (issue 2): 64 producers each awaiting its own ack >= 0.8x the baseline;
``append_many`` batches of 100 >= 300k msgs/s; ack latency p99 <= 5 ms at half of the
64-producer throughput.
"""

from __future__ import annotations

import asyncio
import os
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
    open_loop_latencies,
    percentile,
    remove_dir,
    scratch_dir,
    side_by_side,
)

#: Measured seconds of one closed-loop run, after WARMUP seconds on the same log.
SECONDS = 0.5
WARMUP = 0.1
#: Measured seconds of one open-loop (latency) run, after LATENCY_WARMUP seconds.
LATENCY_SECONDS = 0.6
LATENCY_WARMUP = 0.1
REPEATS = 3
#: The append_many target: this many producers, each appending batches of BATCH.
BATCH_PRODUCERS = 4
BATCH = 100
#: Never wait forever on a WAL that stopped acking.
STALL_SECONDS = 60


async def walsvc_rate(producers: int, batch: int) -> float:
    """Messages/s of ``producers`` coroutines appending to a fresh file WAL
    (``sync="always"``): one ``append`` per call if ``batch`` is 1, else ``append_many``
    of ``batch`` messages."""
    directory = scratch_dir("file-append")
    try:
        wal = await walsvc.open_wal(f"file://{directory}", "p0", sync="always")
        try:

            def append_one(i: int) -> Awaitable[AppendResult]:
                return wal.append(Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]))

            def append_batch(i: int) -> Awaitable[list[AppendResult]]:
                return wal.append_many(
                    [Message(payload=PAYLOAD, vchannel=VCHANNELS[k % 16]) for k in range(batch)]
                )

            operation = append_one if batch == 1 else append_batch
            async with asyncio.timeout(STALL_SECONDS):
                await closed_loop_rate(
                    operation, producers=producers, seconds=WARMUP, items_per_call=batch
                )
                return await closed_loop_rate(
                    operation, producers=producers, seconds=SECONDS, items_per_call=batch
                )
        finally:
            await wal.aclose()
    finally:
        remove_dir(directory)


async def raw_rate(producers: int, batch: int) -> float:
    """Records/s of the raw group-commit baseline with the same producers; a batch is
    handed over as one joined record and acked with one future, as ``append_many`` is."""
    directory = scratch_dir("raw-append")
    try:
        log = RawGroupCommitLog(os.path.join(directory, "log"))
        try:
            records = [PAYLOAD] * batch

            def append(i: int) -> asyncio.Future[None]:
                return log.append(PAYLOAD if batch == 1 else b"".join(records))

            async with asyncio.timeout(STALL_SECONDS):
                await closed_loop_rate(
                    append, producers=producers, seconds=WARMUP, items_per_call=batch
                )
                return await closed_loop_rate(
                    append, producers=producers, seconds=SECONDS, items_per_call=batch
                )
        finally:
            await log.aclose()
    finally:
        remove_dir(directory)


async def walsvc_latencies(rate: float) -> list[float]:
    """Ack latencies (s) of 64 producers offering ``rate`` appends/s to a fresh file WAL."""
    directory = scratch_dir("file-latency")
    try:
        wal = await walsvc.open_wal(f"file://{directory}", "p0", sync="always")
        try:

            def append_one(i: int) -> Awaitable[AppendResult]:
                return wal.append(Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]))

            async with asyncio.timeout(STALL_SECONDS):
                latencies, achieved = await open_loop_latencies(
                    append_one,
                    producers=PRODUCERS,
                    rate=rate,
                    seconds=LATENCY_SECONDS,
                    warmup=LATENCY_WARMUP,
                )
        finally:
            await wal.aclose()
    finally:
        remove_dir(directory)
    _note_latencies("walsvc", rate, achieved, latencies)
    return latencies


async def raw_latencies(rate: float) -> list[float]:
    """Ack latencies (s) of the raw baseline under the same open-loop load."""
    directory = scratch_dir("raw-latency")
    try:
        log = RawGroupCommitLog(os.path.join(directory, "log"))
        try:

            def append(i: int) -> asyncio.Future[None]:
                return log.append(PAYLOAD)

            async with asyncio.timeout(STALL_SECONDS):
                latencies, achieved = await open_loop_latencies(
                    append,
                    producers=PRODUCERS,
                    rate=rate,
                    seconds=LATENCY_SECONDS,
                    warmup=LATENCY_WARMUP,
                )
        finally:
            await log.aclose()
    finally:
        remove_dir(directory)
    _note_latencies("raw", rate, achieved, latencies)
    return latencies


def _note_latencies(what: str, rate: float, achieved: float, latencies: list[float]) -> None:
    note(
        f"{what}: offered {rate:,.0f}/s, achieved {achieved:,.0f}/s,"
        f" p50 {percentile(latencies, 50) * 1e3:.3f} ms,"
        f" p99 {percentile(latencies, 99) * 1e3:.3f} ms,"
        f" max {max(latencies) * 1e3:.3f} ms"
    )


def half_load(loop: asyncio.AbstractEventLoop) -> float:
    """Half of walsvc's 64-producer throughput (best of two runs), in appends/s."""
    (rates,) = side_by_side(loop, 2, lambda: walsvc_rate(PRODUCERS, 1))
    note(f"64-producer throughput {max(rates):,.0f} msgs/s; offering half")
    return max(rates) / 2


class _FileAppend:
    """Shared set-up: a fresh event loop per benchmark process."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 180

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)

    def teardown(self, loop: str) -> None:
        close_loop(self.loop)


class FileAppendRate(_FileAppend):
    """Absolute throughput, best of three runs."""

    unit = "msgs/s"

    def track_append_64_producers(self, loop: str) -> float:
        """walsvc: 64 producers, each awaiting ``append`` of one message."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: walsvc_rate(PRODUCERS, 1))
        return max(rates)

    def track_raw_group_commit_64_producers(self, loop: str) -> float:
        """Baseline: raw group commit, 64 producers each awaiting its own record."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: raw_rate(PRODUCERS, 1))
        return max(rates)

    def track_append_many_100(self, loop: str) -> float:
        """walsvc: 4 producers, each awaiting ``append_many`` of 100 messages (target
        >= 300k msgs/s)."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: walsvc_rate(BATCH_PRODUCERS, BATCH))
        return max(rates)


class FileAppendRatio(_FileAppend):
    """walsvc over the raw baseline, run alternately in one process, best of three each."""

    unit = "ratio"

    def track_append_64_producers_ratio(self, loop: str) -> float:
        """64 producers, one message per append (target >= 0.8)."""
        raw, wal = side_by_side(
            self.loop,
            REPEATS,
            lambda: raw_rate(PRODUCERS, 1),
            lambda: walsvc_rate(PRODUCERS, 1),
        )
        note(f"raw {[round(r) for r in raw]} walsvc {[round(r) for r in wal]} msgs/s")
        return max(wal) / max(raw)

    def track_append_many_100_ratio(self, loop: str) -> float:
        """4 producers, batches of 100 (the baseline hands each batch over joined)."""
        raw, wal = side_by_side(
            self.loop,
            REPEATS,
            lambda: raw_rate(BATCH_PRODUCERS, BATCH),
            lambda: walsvc_rate(BATCH_PRODUCERS, BATCH),
        )
        note(f"raw {[round(r) for r in raw]} walsvc {[round(r) for r in wal]} msgs/s")
        return max(wal) / max(raw)

    def track_ack_p99_ratio(self, loop: str) -> float:
        """Ack latency p99 at half of walsvc's 64-producer throughput, walsvc over the
        baseline under the same offered load (lower is better)."""
        rate = half_load(self.loop)
        raw, wal = side_by_side(
            self.loop, REPEATS, lambda: raw_latencies(rate), lambda: walsvc_latencies(rate)
        )
        return min(percentile(x, 99) for x in wal) / min(percentile(x, 99) for x in raw)


class FileAckLatency(_FileAppend):
    """Ack latency of 64 open-loop producers offering half of the measured 64-producer
    throughput; timed from the ``append`` call to its return; best of three runs."""

    unit = "ms"

    def track_ack_p50(self, loop: str) -> float:
        rate = half_load(self.loop)
        (runs,) = side_by_side(self.loop, REPEATS, lambda: walsvc_latencies(rate))
        return min(percentile(x, 50) for x in runs) * 1e3

    def track_ack_p99(self, loop: str) -> float:
        """Target <= 5 ms."""
        rate = half_load(self.loop)
        (runs,) = side_by_side(self.loop, REPEATS, lambda: walsvc_latencies(rate))
        return min(percentile(x, 99) for x in runs) * 1e3
