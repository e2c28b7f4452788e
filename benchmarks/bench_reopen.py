"""Reopening a big file WAL and writing to it: open + first append + first tail read.

What a restarted service waits for before it works again: ``open_wal`` read-write (lock,
recovery, fencing, timetick recovery), its first append (which waits for the default
chain's start: the opening TimeTick, orphaned transactions; never the dedup window), and
a tailing scanner's first message (``DeliverPolicy.latest()`` then one more append).
Issue 20: this must not grow with the log (a 1 GiB log took 31.6 s to its first append).

Logs of 100 MiB, 1 GiB and 4 GiB of 4 KiB payloads (built once per asv run by
``setup_cache``, ``sync="none"``), written one hour ago by their timeticks (the writer's
clock ran an hour behind): older than the dedup window (``Dedup`` max_age, 600 s), which
the reopen's rebuild therefore finds empty after a binary search for its start. "warm"
reopens with the log in the page cache; "cold" first drops its pages (``posix_fadvise``
DONTNEED on every file), as after a reboot.

- ``track_first_append``: open + first append + first tail read, best of three.
  Target: <= 0.1 s at 1 GiB, flat from 100 MiB to 4 GiB.
- ``track_first_keyed_append``: open + first append with an idempotency key, which waits
  for the dedup window's rebuild (here: a search that finds the window empty).
- ``track_first_append_recent`` / ``track_first_keyed_append_recent``: a 1 GiB log
  written just now, so the whole log is in the dedup window and its rebuild reads it all,
  in the background: the first plain append does not wait for it; a keyed one does.
- ``track_reopen_vs_full_read_ratio``: open + first append + tail read over the time to
  read every byte of the log in the same cache state (lower is better; far below 1 means
  the reopen reads a bounded part of the log).
"""

from __future__ import annotations

import asyncio
import os
import time
import timeit
from collections.abc import Callable

import walsvc
from walsvc import DeliverPolicy, HybridClock, Message

from ._common import (
    VCHANNELS,
    close_loop,
    new_loop,
    note,
    remove_dir,
    scratch_dir,
    side_by_side,
)

MIB = 1 << 20
SIZES = {"100MiB": 100 * MIB, "1GiB": 1024 * MIB, "4GiB": 4096 * MIB}
PAYLOAD_SIZE = 4096
BUILD_BATCH = 256  # 1 MiB of payload per append_many
REPEATS = 3
CACHE_STATES = ("warm", "cold")
#: The newest segment is left about half full: past the last 64 MiB boundary.
EXTRA = 32 * MIB
AN_HOUR_MS = 3_600_000


def log_files(directory: str) -> list[str]:
    """Every regular file under ``directory``."""
    return [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]


def disk_usage(directory: str) -> tuple[int, int]:
    """(bytes in files, bytes allocated on disk) under ``directory``."""
    stats = [os.stat(path) for path in log_files(directory)]
    return sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


def _ms_ago(shift_ms: int) -> Callable[[], int]:
    return lambda: time.time_ns() // 1_000_000 - shift_ms


async def build_log(directory: str, size: int, *, age_ms: int) -> None:
    """Append 4 KiB messages until they hold ``size`` (and ``EXTRA``) of payload, with
    timeticks ``age_ms`` in the past."""
    payload = os.urandom(PAYLOAD_SIZE)
    batch = [Message(payload=payload, vchannel=VCHANNELS[i % 16]) for i in range(BUILD_BATCH)]
    async with await walsvc.open_wal(
        f"file://{directory}", "p0", sync="none", timetick_allocator=HybridClock(_ms_ago(age_ms))
    ) as wal:
        for _ in range((size + EXTRA) // (PAYLOAD_SIZE * BUILD_BATCH)):
            await wal.append_many(batch)


def sync_files(directory: str) -> None:
    """Write back every file, so that dropping their pages really empties the cache."""
    for path in log_files(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_cached_pages(directory: str) -> None:
    """Evict the (clean) pages of every file under ``directory`` from the page cache."""
    for path in log_files(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


async def first_append(directory: str, *, keyed: bool = False, age_ms: int = 0) -> float:
    """Seconds to reopen the log read-write, append once (with a fresh idempotency key if
    ``keyed``), and have a tailing scanner deliver one more append; then close it (not
    timed). ``age_ms`` shifts the writer's clock (0: the real clock)."""
    clock = HybridClock(_ms_ago(age_ms)) if age_ms else None
    start = time.perf_counter()
    wal = await walsvc.open_wal(f"file://{directory}", "p0", timetick_allocator=clock)
    try:
        key = f"bench-{time.time_ns()}" if keyed else None
        await wal.append(Message(payload=b"first", vchannel="v0", idempotency_key=key))
        async with wal.read(DeliverPolicy.latest()) as scanner:
            tail = await wal.append(Message(payload=b"tail", vchannel="v0"))
            async for message in scanner:
                if message.message_id == tail.message_id:
                    break
        elapsed = time.perf_counter() - start
    finally:
        await wal.aclose()
    return elapsed


async def first_open() -> None:
    """Open and close a throwaway file WAL: the first ``open_wal`` of a process also reads
    the backends' entry points and imports the file backend (about 25 ms here), a cost
    this module does not measure."""
    scratch = scratch_dir("first-open")
    try:
        async with await walsvc.open_wal(f"file://{scratch}", "p0"):
            pass
    finally:
        remove_dir(scratch)


def read_everything(directory: str) -> float:
    """Seconds to read every byte under ``directory`` in 1 MiB blocks (the baseline)."""
    start = time.perf_counter()
    buffer = bytearray(MIB)
    for path in sorted(log_files(directory)):
        with open(path, "rb", buffering=0) as file:
            while file.readinto(buffer):
                pass
    return time.perf_counter() - start


def _rounded(seconds: list[float]) -> list[float]:
    return [round(s, 4) for s in seconds]


class _BigLogs:
    """Shared: the logs built once per asv run, and the page-cache state."""

    params = (list(SIZES), list(CACHE_STATES))
    param_names = ("size", "cache")
    timer = timeit.default_timer
    timeout = 1800
    unit = "seconds"

    def setup_cache(self) -> str:
        # asv runs setup_cache in a fresh temporary directory that it deletes once every
        # benchmark using the cache has run, and runs those benchmarks there too.
        root = os.path.abspath("reopen-wal")
        for name, size in SIZES.items():
            directory = os.path.join(root, name)
            start = time.perf_counter()
            asyncio.run(build_log(directory, size, age_ms=AN_HOUR_MS))
            sync_files(directory)
            held, allocated = disk_usage(directory)
            note(
                f"built {directory}: {held / MIB:.0f} MiB in files, {allocated / MIB:.0f} MiB"
                f" allocated, {len(log_files(directory))} files,"
                f" {time.perf_counter() - start:.1f} s"
            )
            if held < size:
                raise AssertionError(f"the log holds {held} bytes, less than {size}")
        return root

    def setup(self, root: str, size: str, cache: str) -> None:
        self.directory = os.path.join(root, size)
        self.loop = new_loop("asyncio")
        self.loop.run_until_complete(first_open())
        self.prepare(cache)

    def prepare(self, cache: str) -> None:
        """Put the log's pages in the requested cache state."""
        if cache == "cold":
            drop_cached_pages(self.directory)
        else:
            read_everything(self.directory)

    def teardown(self, root: str, size: str, cache: str) -> None:
        close_loop(self.loop)

    def best(self, cache: str, measure: Callable[[], float], label: str) -> float:
        times = []
        for _ in range(REPEATS):
            self.prepare(cache)
            times.append(measure())
        note(f"{label} ({os.path.basename(self.directory)}, {cache}) {_rounded(times)} s")
        return min(times)


class FirstAppend(_BigLogs):
    """Open + first append + first tail read after a reopen, best of three."""

    def track_first_append(self, root: str, size: str, cache: str) -> float:
        directory = self.directory
        return self.best(
            cache, lambda: self.loop.run_until_complete(first_append(directory)), "first append"
        )

    def track_first_keyed_append(self, root: str, size: str, cache: str) -> float:
        directory = self.directory
        return self.best(
            cache,
            lambda: self.loop.run_until_complete(first_append(directory, keyed=True)),
            "first keyed append",
        )


class FirstAppendRecent(_BigLogs):
    """A 1 GiB log written just now (built in ``setup``: the shared logs may have aged
    past the window by the time this runs), so its whole length is in the dedup window.
    A plain first append does not wait for the window's rebuild; a keyed one does, and
    the rebuild reads the window (here: the whole log)."""

    params = (["1GiB"], list(CACHE_STATES))

    def setup(self, root: str, size: str, cache: str) -> None:
        self.scratch = scratch_dir("recent")
        self.directory = os.path.join(self.scratch, size)
        self.loop = new_loop("asyncio")
        self.loop.run_until_complete(first_open())
        self.loop.run_until_complete(build_log(self.directory, SIZES[size], age_ms=0))
        sync_files(self.directory)

    def teardown(self, root: str, size: str, cache: str) -> None:
        close_loop(self.loop)
        remove_dir(self.scratch)

    def track_first_append_recent(self, root: str, size: str, cache: str) -> float:
        directory = self.directory
        return self.best(
            cache,
            lambda: self.loop.run_until_complete(first_append(directory)),
            "first append, log in the window",
        )

    def track_first_keyed_append_recent(self, root: str, size: str, cache: str) -> float:
        directory = self.directory
        return self.best(
            cache,
            lambda: self.loop.run_until_complete(first_append(directory, keyed=True)),
            "first keyed append, log in the window",
        )


class ReopenRatio(_BigLogs):
    """Open + first append + tail read over the time to read the whole log, in the same
    cache state, alternately, best of three each (lower is better)."""

    unit = "ratio"

    def track_reopen_vs_full_read_ratio(self, root: str, size: str, cache: str) -> float:
        directory = self.directory

        async def full_read() -> float:
            self.prepare(cache)
            return read_everything(directory)

        async def reopened() -> float:
            self.prepare(cache)
            return await first_append(directory)

        full, times = side_by_side(self.loop, REPEATS, full_read, reopened)
        note(f"full read {_rounded(full)} s, first append {_rounded(times)} s")
        return min(times) / min(full)
