"""The interceptor chain's cost, end-to-end visibility, and the idle cost of timetick sync.

Targets (issue 3):
- full default chain vs a bare WAL (``interceptors=[]``: the serialization point alone)
  on ``memory://``, 64 producers: cost ratio (bare rate / chain rate) <= 1.3; also
  reported against the backend alone (pre-encoded records straight to
  ``MemoryBackend.append``);
- ``file://`` (sync=always): append -> delivered to a tailing reader, p99 <= 15 ms at
  10k msgs/s;
- 100 idle pchannels with the 10 ms sync: <= 2% of one core.
"""

from __future__ import annotations

import asyncio
import itertools
import resource
import time
import timeit
from collections.abc import Awaitable, Sequence
from typing import Any

import walsvc
from walsvc import AppendResult, Message, MessageId
from walsvc.core._encode import encode

from ._common import (
    LOOPS,
    PAYLOAD,
    PRODUCERS,
    VCHANNELS,
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

SECONDS = 0.5
WARMUP = 0.1
REPEATS = 3
_names = itertools.count()


async def _wal_rate(interceptors: Sequence[Any] | None) -> float:
    wal = await walsvc.open_wal(
        f"memory://bench-chain-{next(_names)}", "p0", interceptors=interceptors
    )
    try:
        await wal.wait_ready()

        def append_one(i: int) -> Awaitable[AppendResult]:
            return wal.append(Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]))

        await closed_loop_rate(append_one, producers=PRODUCERS, seconds=WARMUP)
        return await closed_loop_rate(append_one, producers=PRODUCERS, seconds=SECONDS)
    finally:
        await _drop_and_close(wal)


async def _drop_and_close(wal: walsvc.WAL) -> None:
    """Memory logs live as long as the process: drop the records, then close."""
    last = await wal.latest_message_id()
    if last is not None:
        await wal.truncate(last)
    await wal.aclose()


async def chain_rate() -> float:
    """64 producers through the full default chain."""
    return await _wal_rate(None)


async def bare_rate() -> float:
    """64 producers through a WAL without interceptors (tick + encode + backend)."""
    return await _wal_rate([])


async def backend_rate() -> float:
    """64 producers appending pre-encoded records straight to the memory backend."""
    wal = await walsvc.open_wal(f"memory://bench-raw-{next(_names)}", "p0", interceptors=[])
    backend = wal.backend
    tick = itertools.count(1)
    try:

        async def append_one(i: int) -> Sequence[MessageId]:
            record = encode(
                Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]), timetick=next(tick), term=1
            )
            return await backend.append((record,))

        await closed_loop_rate(append_one, producers=PRODUCERS, seconds=WARMUP)
        return await closed_loop_rate(append_one, producers=PRODUCERS, seconds=SECONDS)
    finally:
        await _drop_and_close(wal)


async def visibility_ms(rate: float = 10_000, seconds: float = 2.0) -> tuple[float, float]:
    """p50 and p99 (ms) from ``append`` to delivery to a tailing reader, file://,
    sync=always, ``rate`` msgs/s offered by 16 paced producers."""
    path = scratch_dir("visibility")
    try:
        async with await walsvc.open_wal(f"file://{path}", "p0") as wal:
            await wal.wait_ready()
            sent_at: dict[bytes, float] = {}
            seen: list[float] = []
            clock = time.perf_counter
            counter = itertools.count()

            async def reader() -> None:
                async with wal.read(walsvc.DeliverPolicy.latest()) as scanner:
                    async for batch in scanner.batches():
                        now = clock()
                        for message in batch:
                            began = sent_at.pop(message.payload, None)
                            if began is not None:
                                seen.append(now - began)

            task = asyncio.ensure_future(reader())
            await asyncio.sleep(0.05)

            async def append_one(i: int) -> AppendResult:
                payload = next(counter).to_bytes(8, "little") + PAYLOAD[8:]
                sent_at[payload] = clock()
                return await wal.append(Message(payload=payload, vchannel="v"))

            await open_loop_latencies(
                append_one, producers=16, rate=rate, seconds=seconds, warmup=0.3
            )
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not seen:
            raise RuntimeError("the reader saw nothing")
        return percentile(seen, 50) * 1e3, percentile(seen, 99) * 1e3
    finally:
        remove_dir(path)


async def idle_cpu_percent(pchannels: int = 100, seconds: float = 2.0) -> float:
    """CPU used by ``pchannels`` idle writers with the default 10 ms sync, as % of one
    core (process CPU time over wall time, after opening)."""
    name = f"memory://bench-idle-{next(_names)}"
    wals = [await walsvc.open_wal(name, f"p{i}") for i in range(pchannels)]
    try:
        for wal in wals:
            await wal.wait_ready()
        await asyncio.sleep(0.1)  # the first sync after the opening TimeTick
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = usage.ru_utime + usage.ru_stime
        wall0 = time.perf_counter()
        await asyncio.sleep(seconds)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime - cpu0
        return 100 * cpu / (time.perf_counter() - wall0)
    finally:
        for wal in wals:
            await wal.aclose()


class _Chain:
    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 120

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)

    def teardown(self, loop: str) -> None:
        close_loop(self.loop)


class ChainCost(_Chain):
    """Cost ratios (higher rate of the baseline / rate with the chain), side by side."""

    unit = "ratio"

    def track_default_chain_vs_bare_wal(self, loop: str) -> float:
        """Target <= 1.3."""
        bare, chain = side_by_side(self.loop, REPEATS, bare_rate, chain_rate)
        note(f"bare {[round(r) for r in bare]} chain {[round(r) for r in chain]} msgs/s")
        return max(bare) / max(chain)

    def track_default_chain_vs_backend_alone(self, loop: str) -> float:
        raw, chain = side_by_side(self.loop, REPEATS, backend_rate, chain_rate)
        note(f"backend {[round(r) for r in raw]} chain {[round(r) for r in chain]} msgs/s")
        return max(raw) / max(chain)


class Visibility(_Chain):
    """Append -> delivered to a tailing reader on file:// (sync=always) at 10k msgs/s."""

    unit = "ms"

    def track_visibility_p99(self, loop: str) -> float:
        """Target <= 15 ms (Milvus: a 200 ms tick interval)."""
        p50, p99 = self.loop.run_until_complete(visibility_ms())
        note(f"visibility p50 {p50:.2f} ms p99 {p99:.2f} ms")
        return p99


class IdleSync(_Chain):
    """100 idle pchannels with the 10 ms timetick sync."""

    unit = "% of one core"

    def track_idle_100_pchannels(self, loop: str) -> float:
        """Target <= 2%. Best of three 2 s runs, as every track_* figure (other work on
        the machine only ever adds CPU); every run's figure goes to stderr."""
        (runs,) = side_by_side(self.loop, REPEATS, idle_cpu_percent)
        note(f"idle: {[round(r, 2) for r in runs]} % of a core")
        return min(runs)
