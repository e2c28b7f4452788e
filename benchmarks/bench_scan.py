"""Scanning a file WAL with a vchannel filter, against decoding every record.

The log (built once per asv run by ``setup_cache``): 400k messages of 100 bytes over 16
vchannels, round robin, so "v3" holds 1 in 16 (25k). The filtered scan reads until it has
seen all 25k matches (scanners tail forever, so every scan reads to a known count); the
baseline reads all 400k with no filter and keeps those whose ``vchannel`` is "v3" in
Python. Both read the whole log, warm in the page cache; the rate is records examined
(400k) per second.

Targets (issue 2): >= 1.5M records examined/s, and >= 5x the decode-everything baseline
measured side by side (alternately, best of three each).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import timeit

import walsvc
from walsvc import Filter, Message

from . import _common
from ._common import (
    LOOPS,
    PAYLOAD,
    STALL_SECONDS,
    VCHANNELS,
    close_loop,
    new_loop,
    note,
    side_by_side,
)

RECORDS = 400_000
#: append_many batch used to build the log; a multiple of 16 keeps the round robin exact.
BUILD_BATCH = 800
WANTED = "v3"
MATCHES = RECORDS // len(VCHANNELS)
REPEATS = 3


async def build_log(directory: str) -> None:
    """Append RECORDS messages, vchannel ``v{i % 16}`` for the i-th, and nothing else (no
    interceptors, so no TimeTicks: broadcasts would pass every vchannel filter)."""
    batch = [Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(BUILD_BATCH)]
    url = f"file://{directory}"
    async with await walsvc.open_wal(url, "p0", sync="none", interceptors=[]) as wal:
        for _ in range(RECORDS // BUILD_BATCH):
            await wal.append_many(batch)


async def filtered_scan(wal: walsvc.WAL) -> float:
    """Records examined per second by a scan filtered to one vchannel of 16."""
    start = time.perf_counter()
    seen = 0
    async with (
        asyncio.timeout(STALL_SECONDS),
        wal.read(filters=[Filter(vchannels=[WANTED])]) as scanner,
        contextlib.aclosing(scanner.batches()) as batches,
    ):
        async for batch in batches:
            seen += len(batch)
            if seen >= MATCHES:
                break
    elapsed = time.perf_counter() - start
    if seen != MATCHES:
        raise AssertionError(f"filtered scan saw {seen} messages, expected {MATCHES}")
    return RECORDS / elapsed


async def decode_all_scan(wal: walsvc.WAL) -> float:
    """Records per second of the baseline: decode every record, filter in Python."""
    return await _common.decode_all_scan(wal, records=RECORDS, wanted=WANTED, matches=MATCHES)


class _ScanLog:
    """Shared: the log built once per asv run, a read-only WAL per benchmark process."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 300

    def setup_cache(self) -> str:
        # asv runs setup_cache in a fresh temporary directory that it deletes once every
        # benchmark using the cache has run, and runs those benchmarks there too.
        directory = os.path.abspath("scan-wal")
        asyncio.run(build_log(directory))
        return directory

    def setup(self, directory: str, loop: str) -> None:
        self.loop = new_loop(loop)
        self.wal = self.loop.run_until_complete(
            walsvc.open_wal(f"file://{directory}", "p0", read_only=True)
        )

    def teardown(self, directory: str, loop: str) -> None:
        self.loop.run_until_complete(self.wal.aclose())
        close_loop(self.loop)


class FileScanRate(_ScanLog):
    """Absolute scan rates, best of three."""

    unit = "records/s"

    def track_filtered_1_of_16(self, directory: str, loop: str) -> float:
        """walsvc: vchannel filter, records examined per second (target >= 1.5M)."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: filtered_scan(self.wal))
        return max(rates)

    def track_decode_all(self, directory: str, loop: str) -> float:
        """Baseline: no filter, every record decoded, filtered in Python."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: decode_all_scan(self.wal))
        return max(rates)


class FileScanRatio(_ScanLog):
    """Filtered scan over the decode-everything baseline, alternately, best of three."""

    unit = "ratio"

    def track_filtered_vs_decode_all_ratio(self, directory: str, loop: str) -> float:
        """Target >= 5."""
        full, filtered = side_by_side(
            self.loop,
            REPEATS,
            lambda: decode_all_scan(self.wal),
            lambda: filtered_scan(self.wal),
        )
        note(f"decode-all {[round(r) for r in full]} filtered {[round(r) for r in filtered]}")
        return max(filtered) / max(full)


class FileScanTime(_ScanLog):
    """Wall time of one filtered scan of the 400k-record log (asv's sampled timing)."""

    repeat = (3, 10, 5.0)
    warmup_time = 0.0

    def time_filtered_scan(self, directory: str, loop: str) -> None:
        self.loop.run_until_complete(filtered_scan(self.wal))
