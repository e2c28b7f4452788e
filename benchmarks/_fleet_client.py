"""The client processes of ``bench_remote_fleet`` and ``bench_remote_reads``, and what
they share with them: the stamped payload, the windowed closed-loop producers and the
tailing consumers.

    python -m benchmarks._fleet_client append URL PCHANNEL PRODUCERS WARMUP SECONDS LOOP
    python -m benchmarks._fleet_client tail URL PCHANNEL CONSUMERS LOOP

A child speaks in lines: it prints ``ready`` once set up, then one JSON dict with its
figures. ``append`` opens one WAL (one connection) for its PRODUCERS coroutines, appends
once (the node's WAL is then ready), prints ``ready`` and waits for ``go START`` on stdin
(START: a ``time.monotonic()`` instant, the same clock in every process on this machine);
from START its producers each await ``append`` back to back for WARMUP + SECONDS, and it
reports the appends that completed in the last SECONDS and its CPU time in them.
``tail`` opens CONSUMERS read-only WALs (a connection each), each with one scanner from
``DeliverPolicy.latest()``, prints ``ready`` once the node has every stream, and reads
until every scanner has the stop message (see ``stamped``); it reports what each
received and the visibility latencies of the messages stamped "measured", then waits for
stdin to close before it disconnects.

Nothing here is named like an asv benchmark, so asv's discovery ignores this module.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import walsvc
from walsvc import DeliverPolicy, Message, Scanner

from ._common import (
    PAYLOAD,
    STALL_SECONDS,
    VCHANNELS,
    close_loop,
    die_with_parent,
    new_loop,
    percentile,
)

#: A stamped payload starts with the ``time.monotonic_ns()`` of the append call and a flag.
STAMP: Final = struct.Struct("<qB")
UNMEASURED: Final = 0
MEASURED: Final = 1
STOP: Final = 2
_PADDING: Final = PAYLOAD[STAMP.size :]


def stamped(flag: int) -> bytes:
    """A 100-byte payload stamped now with ``flag`` (UNMEASURED, MEASURED or STOP)."""
    return STAMP.pack(time.monotonic_ns(), flag) + _PADDING


def message(i: int, flag: int = UNMEASURED) -> Message:
    """Producer i's message (vchannel ``v{i % 16}``), stamped now."""
    return Message(payload=stamped(flag), vchannel=VCHANNELS[i % len(VCHANNELS)])


async def at(instant: float) -> None:
    """Sleep until ``instant`` (``time.monotonic()``)."""
    delay = instant - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def windowed_appends(
    operation: Callable[[int], Awaitable[object]],
    *,
    producers: int,
    start: float,
    warmup: float,
    seconds: float,
) -> tuple[int, float]:
    """From ``start`` (``time.monotonic()``), ``producers`` coroutines each await
    ``operation(i)`` back to back for ``warmup + seconds``; return how many calls
    completed in the last ``seconds`` (calls in flight at the end are not counted) and
    this process's CPU time (``time.process_time``) in that window."""
    clock = time.monotonic
    await at(start)
    window_start = start + warmup
    end = window_start + seconds
    counted = 0

    async def producer(i: int) -> None:
        nonlocal counted
        while clock() < end:
            await operation(i)
            done = clock()
            if window_start <= done <= end:
                counted += 1

    async def cpu() -> float:
        await at(window_start)
        before = time.process_time()
        await at(end)
        return time.process_time() - before

    *_, spent = await asyncio.gather(*(producer(i) for i in range(producers)), cpu())
    return counted, spent


async def consume(scanner: Scanner, latencies: list[int] | None = None) -> int:
    """Read ``scanner`` until the STOP message; return how many messages came before it.
    With ``latencies``, append now - stamp (ns) for each MEASURED message, ``now`` taken
    once per batch, when the batch reaches this consumer."""
    received = 0
    unpack = STAMP.unpack_from
    async with asyncio.timeout(STALL_SECONDS):
        async for batch in scanner.batches():
            now = time.monotonic_ns()
            for m in batch:
                stamp, flag = unpack(m.payload)
                if flag == STOP:
                    return received
                received += 1
                if flag == MEASURED and latencies is not None:
                    latencies.append(now - stamp)
    raise AssertionError("the scanner ended before the stop message")


def latency_summary(latencies: list[int]) -> dict[str, float]:
    """p50, p99 and max in ms, and the count, of latencies in ns."""
    if not latencies:
        return {"count": 0}
    return {
        "count": len(latencies),
        "p50_ms": percentile(latencies, 50) / 1e6,
        "p99_ms": percentile(latencies, 99) / 1e6,
        "max_ms": max(latencies) / 1e6,
    }


async def _line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def _say(item: str | dict[str, Any]) -> None:
    print(item if isinstance(item, str) else json.dumps(item), flush=True)


async def _append(url: str, pchannel: str, producers: int, warmup: float, seconds: float) -> None:
    wal = await walsvc.open_wal(url, pchannel)
    try:
        await wal.append(message(0))
        _say("ready")
        command, _, start = (await _line()).partition(" ")
        if command != "go":
            raise RuntimeError(f"expected 'go START', got {command!r}")

        async def operation(i: int) -> object:
            return await wal.append(message(i))

        count, cpu = await windowed_appends(
            operation, producers=producers, start=float(start), warmup=warmup, seconds=seconds
        )
        _say({"count": count, "cpu": cpu})
    finally:
        await wal.aclose()


async def _tail(url: str, pchannel: str, consumers: int) -> None:
    wals: list[walsvc.WAL] = []
    try:
        while len(wals) < consumers:  # one at a time: a failed open closes those before
            wals.append(await walsvc.open_wal(url, pchannel, read_only=True))
        scanners = [wal.read(DeliverPolicy.latest()) for wal in wals]
        # The node registers a stream when it reads the Read; a later request on the
        # same connection is answered after that: every stream now starts before any
        # message appended from here on.
        await asyncio.gather(*(wal.latest_message_id() for wal in wals))
        _say("ready")
        latencies: list[int] = []
        received = await asyncio.gather(*(consume(s, latencies) for s in scanners))
        _say({"received": received, **latency_summary(latencies)})
        await _line()  # the parent has read the figures (and sampled the node)
        for scanner in scanners:
            await scanner.aclose()
    finally:
        for wal in wals:
            await wal.aclose()


def main(argv: list[str]) -> None:
    die_with_parent()
    role, *args = argv
    if role == "append":
        url, pchannel, producers, warmup, seconds, kind = args
        work = _append(url, pchannel, int(producers), float(warmup), float(seconds))
    elif role == "tail":
        url, pchannel, consumers, kind = args
        work = _tail(url, pchannel, int(consumers))
    else:
        raise SystemExit(f"unknown role {role!r}")
    loop = new_loop(kind)
    try:
        loop.run_until_complete(work)
    finally:
        close_loop(loop)


if __name__ == "__main__":
    main(sys.argv[1:])
