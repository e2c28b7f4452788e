"""What the benchmark modules share: event loops, the 100-byte payload, the raw group-commit
baseline, the decode-everything scan baseline, closed- and open-loop producer drivers,
side-by-side repetition, and child processes that do not outlive the benchmark.

Nothing here is named like an asv benchmark (``time_*``, ``track_*``, ``Time*``, ...), so
asv's discovery ignores this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import walsvc

__all__ = (
    "LOOPS",
    "PAYLOAD",
    "PRODUCERS",
    "REPEATS",
    "STALL_SECONDS",
    "VCHANNELS",
    "BrokerBench",
    "RawGroupCommitLog",
    "best_ratio",
    "child_environment",
    "close_loop",
    "closed_loop_rate",
    "decode_all_scan",
    "die_with_parent",
    "new_loop",
    "note",
    "open_loop_latencies",
    "percentile",
    "remove_dir",
    "scratch_dir",
    "side_by_side",
)

_T = TypeVar("_T")

#: Event loops the benchmarks are parametrized over; uvloop is the fast path.
LOOPS = ("uvloop", "asyncio")
#: The issue's record size: 100-byte payloads.
PAYLOAD = bytes(range(100))
#: Concurrent producers of the 64-producer targets.
PRODUCERS = 64
#: Producer i writes vchannel ``VCHANNELS[i % 16]``.
VCHANNELS = tuple(f"v{i}" for i in range(16))
#: A scan that makes no progress for this long fails instead of hanging the run.
STALL_SECONDS = 120
#: Runs of each side of a ratio (alternately); the best of each counts.
REPEATS = 3


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A fresh event loop of ``kind`` ("uvloop" or "asyncio"), set as the current loop."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            # asv reports a NotImplementedError raised in setup as "skipped".
            raise NotImplementedError("uvloop is not installed") from None
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    elif kind == "asyncio":
        loop = asyncio.new_event_loop()
    else:
        raise ValueError(f"unknown event loop {kind!r}")
    asyncio.set_event_loop(loop)
    return loop


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Shut ``loop`` down cleanly (async generators, default executor) and close it."""
    if loop.is_closed():
        return
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def scratch_dir(tag: str) -> str:
    """A new empty directory on the temp file system (same disk as the project here)."""
    return tempfile.mkdtemp(prefix=f"walsvc-bench-{tag}-")


def remove_dir(path: str | None) -> None:
    """Remove ``path`` and everything under it, if it exists."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


#: Environment variable naming the pid a benchmark's child process must not outlive.
PARENT_PID_VARIABLE = "WALSVC_BENCH_PARENT"
_PR_SET_PDEATHSIG = 1


def child_environment() -> dict[str, str]:
    """The environment of a child process that calls ``die_with_parent``."""
    return {**os.environ, PARENT_PID_VARIABLE: str(os.getpid())}


def die_with_parent() -> None:
    """In a child started with ``child_environment()``: have Linux send this process
    SIGTERM when its parent dies, however it dies (asv kills a benchmark that runs past
    its timeout with SIGTERM, then SIGKILL, and runs no teardown), and exit now if the
    parent is already gone."""
    parent = os.environ.get(PARENT_PID_VARIABLE)
    if parent is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(parent):
        raise SystemExit("the benchmark process that started this one is gone")


def note(message: str) -> None:
    """A diagnostic line on stderr (``asv run --show-stderr`` prints it)."""
    print(f"[walsvc-bench] {message}", file=sys.stderr, flush=True)


def side_by_side(
    loop: asyncio.AbstractEventLoop,
    repeats: int,
    *measures: Callable[[], Coroutine[Any, Any, _T]],
) -> list[list[_T]]:
    """Run each measure ``repeats`` times, alternating between them, and the order
    reversed every other round (A B, B A, A B, ...), so that machine noise drifting
    through the run hits all of them alike rather than the one measured last; return
    one list of results per measure, in the measures' order."""
    results: list[list[_T]] = [[] for _ in measures]
    for round_ in range(repeats):
        pairs = list(zip(results, measures, strict=True))
        for out, measure in pairs if round_ % 2 == 0 else reversed(pairs):
            out.append(loop.run_until_complete(measure()))
    return results


def paired_ratio(base: Sequence[float], ours: Sequence[float]) -> float:
    """The median over rounds of ``ours[i] / base[i]``, for results of ``side_by_side``:
    each pair was measured back to back, so noise drifting through the run cancels within
    a pair, and the median drops the rounds a burst of noise hit. For an effect of a few
    percent; best-of ratios (``best_ratio``) compare two maxima taken at different times,
    and their A/A spread here reached 0.92-1.04 on a noisy day."""
    return statistics.median(a / b for a, b in zip(ours, base, strict=True))


def best_ratio(
    loop: asyncio.AbstractEventLoop,
    what: str,
    baseline: tuple[str, Callable[[], Coroutine[Any, Any, float]]],
    ours: tuple[str, Callable[[], Coroutine[Any, Any, float]]],
) -> float:
    """Best-of-REPEATS rate of ``ours`` over the best of ``baseline`` (each a label and a
    measure returning a rate), measured side by side; every run's figure goes to stderr."""
    (base_label, base_measure), (our_label, our_measure) = baseline, ours
    base, mine = side_by_side(loop, REPEATS, base_measure, our_measure)
    note(f"{what}: {base_label} {[round(r) for r in base]} msgs/s")
    note(f"{what}: {our_label} {[round(r) for r in mine]} msgs/s")
    return max(mine) / max(base)


class BrokerBench:
    """An asv base for ratios on a real broker: each ``setup`` makes a fresh event loop
    (parameter ``loop``) and starts a broker of the benchmark's own with
    ``start_broker``; ``teardown`` closes the loop and stops the broker by its pid."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 180
    unit = "ratio"
    loop: asyncio.AbstractEventLoop
    broker: Any

    def start_broker(self) -> Any:
        """A started broker with a ``close()`` that stops it."""
        raise NotImplementedError

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)
        try:
            self.broker = self.start_broker()
        except BaseException:
            close_loop(self.loop)
            raise

    def teardown(self, loop: str) -> None:
        try:
            close_loop(self.loop)
        finally:
            self.broker.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


async def closed_loop_rate(
    operation: Callable[[int], Awaitable[object]],
    *,
    producers: int,
    seconds: float,
    items_per_call: int = 1,
) -> float:
    """Items per second when ``producers`` coroutines each await ``operation(i)`` back to
    back for ``seconds`` (each finishes the call in flight at the deadline)."""
    clock = time.perf_counter

    async def producer(i: int) -> int:
        calls = 0
        while clock() < deadline:
            await operation(i)
            calls += 1
        return calls

    start = clock()
    deadline = start + seconds
    counts = await asyncio.gather(*(producer(i) for i in range(producers)))
    elapsed = clock() - start
    return sum(counts) * items_per_call / elapsed


async def open_loop_latencies(
    operation: Callable[[int], Awaitable[object]],
    *,
    producers: int,
    rate: float,
    seconds: float,
    warmup: float,
) -> tuple[list[float], float]:
    """Offer ``rate`` calls per second in total from ``producers`` coroutines that pace
    themselves by a fixed schedule (producer i at offsets i/rate + k*producers/rate) for
    ``warmup + seconds``; return each call's latency in seconds (calls started after the
    warm-up, timed from the call to its return) and the call rate achieved in that window.

    A producer that falls behind its schedule calls back to back until it catches up, so
    the offered load does not drop when acks slow down.
    """
    clock = time.perf_counter
    interval = producers / rate
    start = clock() + 0.005
    record_from = start + warmup
    end = record_from + seconds
    latencies: list[float] = []
    sleep = asyncio.sleep

    async def producer(i: int) -> None:
        due = start + i / rate
        while due < end:
            now = clock()
            if now < due:
                await sleep(due - now)
            began = clock()
            await operation(i)
            if began >= record_from:
                latencies.append(clock() - began)
            due += interval

    await asyncio.gather(*(producer(i) for i in range(producers)))
    return latencies, len(latencies) / seconds


async def decode_all_scan(wal: walsvc.WAL, *, records: int, wanted: str, matches: int) -> float:
    """The baseline of the filtered-scan targets: read the whole log (``records`` records)
    with no filter, every record decoded, and keep those of vchannel ``wanted`` in Python
    (there must be ``matches``). Returns records per second."""
    start = time.perf_counter()
    seen = 0
    kept = 0
    async with (
        asyncio.timeout(STALL_SECONDS),
        wal.read() as scanner,
        contextlib.aclosing(scanner.batches()) as batches,
    ):
        async for batch in batches:
            seen += len(batch)
            kept += sum(1 for m in batch if m.vchannel == wanted)
            if seen >= records:
                break
    elapsed = time.perf_counter() - start
    if (seen, kept) != (records, matches):
        raise AssertionError(
            f"full scan saw {seen} messages, {kept} of {wanted!r}; expected {records} and {matches}"
        )
    return records / elapsed


class RawGroupCommitLog:
    """The baseline of the durable-append targets: raw group commit with no envelope.

    Producers hand over (record, future) with ``append``; one writer task drains
    everything queued, writes it with one ``os.write`` and one ``os.fdatasync`` in a
    single worker thread (one executor hop per batch), then resolves the futures. While a
    sync is in flight the next batch accumulates. With ``path=None`` the writer keeps the
    batch in memory instead (no I/O, no thread): the cost of the asyncio hand-off alone.
    """

    def __init__(self, path: str | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = (
            None if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        )
        self._executor = (
            None if path is None else ThreadPoolExecutor(1, thread_name_prefix="raw-log")
        )
        self._records: list[bytes] = []
        self._futures: list[asyncio.Future[None]] = []
        self._wakeup: asyncio.Future[None] | None = None
        self._closing = False
        self.written = 0
        self.batches = 0
        self._task = self._loop.create_task(self._run())

    def append(self, record: bytes) -> asyncio.Future[None]:
        """Queue ``record``; the future resolves once it is written (and synced)."""
        future = self._loop.create_future()
        self._records.append(record)
        self._futures.append(future)
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set_result(None)
        return future

    async def _run(self) -> None:
        loop = self._loop
        while True:
            if not self._records:
                if self._closing:
                    return
                self._wakeup = loop.create_future()
                await self._wakeup
                continue
            records, futures = self._records, self._futures
            self._records, self._futures = [], []
            try:
                if self._executor is not None:
                    await loop.run_in_executor(self._executor, self._write, b"".join(records))
                else:
                    self.written += sum(map(len, records))
            except BaseException as exc:
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
                raise
            self.batches += 1
            for future in futures:
                if not future.done():
                    future.set_result(None)

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fdatasync(self._fd)
        self.written += len(data)

    async def aclose(self) -> None:
        """Finish queued appends and release the file and the thread."""
        self._closing = True
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set_result(None)
        await self._task
        if self._executor is not None:
            self._executor.shutdown()
        if self._fd is not None:
            os.close(self._fd)
