"""The node over the network (issue 23), the read targets: what a filtered read and a
fan-out cost the node, and catch-up delivery on its own.

Every node is a subprocess (``python -m walsvc serve``, on loopback) started in
``setup`` and stopped by its pid in ``teardown``; its scratch directory goes with it
(``_fleet.FleetBench``). Parameter ``loop`` is every process's loop: this process, the
client processes (``benchmarks._fleet_client``) and the node. Payloads are 100 bytes.
Node CPU: ``_fleet.process_cpu``. Each figure runs both sides alternately, three times
each, and takes the best (highest rate, lowest CPU) of each side. The append targets:
``bench_remote_fleet``.

- ``FilterCpu.track_filter_cpu_ratio``: a ``file://`` log of 200k messages over 16
  vchannels round robin, built by an embedded writer (default chain) and copied before
  anything else opens it; the node serves the log, an embedded read-write WAL in this
  process opens the copy, and each gets a "v3" sentinel with an idempotency key. Node
  CPU of a remote ``read(DeliverPolicy.all(), filters=[scanners.vchannel("v3")])`` from
  the start until its sentinel arrives, per record in the log up to the sentinel
  (TimeTicks included), over ``time.process_time`` per record of the same read of the
  copy by the embedded WAL. Lower is better; target <= 1.5.
- ``FanOutCpu.track_fanout_cpu_ratio``: a node over ``memory://``; k remote consumers
  (k = 64: 4 client processes of 16, each consumer on its own connection; k = 1: one
  process) tail one pchannel from ``latest`` while a producer in this process appends
  700 msgs/s for 1.5 s as one ``append_many`` of 10 every 1/70 s (open loop: 106 calls,
  1,060 messages), then a stop message. Node CPU from the first append until every
  consumer reported the stop message, per message delivered, after subtracting the CPU
  of the same run with no consumer (the appends alone): (64 consumers) / (1 consumer).
  Target <= 2. The producer has ``exactly_once=False`` and batches so that the appends'
  CPU stays small next to one consumer's (a single plain append costs the node about
  70 us, a message of ``append_many`` of 10 about 10 us); the rate is low enough that 64
  consumers keep the node well below one core (at 1,000 single appends/s it was 0.86 of
  a core busy, and its deliveries then grow into batches that cost less per message,
  which flatters the 64 side). Stderr: each run's CPU, the node's busy share and the
  ratio without the subtraction.
- ``CatchUp.track_catchup_consumer_ratio``: the log and copy of ``FilterCpu``;
  messages/s one remote consumer receives reading the log with
  ``read(DeliverPolicy.all())`` from the ``read`` call until the sentinel, over the same
  read of the copy by the embedded WAL. This is delivery on its own: bench_remote's
  tailing ratio is bounded by its remote producer.

Run alone: ``python -m benchmarks.bench_remote_reads [FIGURE ...] [LOOP ...]`` prints
every figure (or those named, e.g. ``track_filter_cpu_ratio``) for each loop (or those
named).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final

import scanners
import walsvc
from walsvc import DeliverPolicy, Message, MessageId

from ._common import (
    PAYLOAD,
    REPEATS,
    STALL_SECONDS,
    VCHANNELS,
    note,
    open_loop_latencies,
    side_by_side,
)
from ._fleet import (
    FleetBench,
    client_processes,
    cpu_between,
    new_pchannel,
    process_cpu,
    run_figures,
)
from ._fleet_client import STOP, message, stamped
from .bench_remote import NodeProcess

# -- 1 and 3. a filled log read from the start -------------------------------------------

LOG_RECORDS = 200_000
#: append_many batch used to build the log; a multiple of 16 keeps the round robin exact.
BUILD_BATCH = 800
WANTED = "v3"


async def build_log(url: str) -> None:
    """LOG_RECORDS messages (vchannel ``v{i % 16}``), default chain, ``sync="none"``."""
    batch = [Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(BUILD_BATCH)]
    async with await walsvc.open_wal(url, "p0", sync="none") as wal:
        for _ in range(LOG_RECORDS // BUILD_BATCH):
            await wal.append_many(batch)


async def read_until(
    wal: walsvc.WAL, last: MessageId, *, filters: Sequence[Any] = (), raw: bool = False
) -> int:
    """Read ``wal`` from the start until the message ``last``; return how many messages
    were delivered (``last`` included)."""
    delivered = 0
    async with (
        asyncio.timeout(STALL_SECONDS),
        wal.read(DeliverPolicy.all(), filters, raw=raw) as scanner,
        contextlib.aclosing(scanner.batches()) as batches,
    ):
        async for batch in batches:
            if batch[-1].message_id < last:
                delivered += len(batch)
                continue
            for m in batch:  # the last batch; raw reads may have TimeTicks after ``last``
                delivered += 1
                if m.message_id >= last:
                    if m.message_id != last:
                        raise AssertionError(f"read past {last!r} to {m.message_id!r}")
                    return delivered
    raise AssertionError(f"the read ended before {last!r}")


class _FilledLog(FleetBench):
    """A file:// log of LOG_RECORDS messages and a copy of it: the node serves the log,
    ``self.remote`` is a read-write WAL on it through the node; ``self.local`` is an
    embedded read-write WAL on the copy. Each has a "v3" sentinel appended with an
    idempotency key (the append waits for the dedup window's rebuild from the log, which
    would otherwise run during the first reads); ``self.last`` has both sentinels' ids,
    ``self.records`` each log's records up to its sentinel (TimeTicks included; the
    served log's counted by a read-only embedded WAL)."""

    remote: walsvc.WAL
    local: walsvc.WAL

    def start(self) -> None:
        served, copy = self.scratch("filled-log"), self.scratch("filled-copy")
        run = self.loop.run_until_complete
        run(build_log(f"file://{served}"))
        shutil.copytree(served, copy, dirs_exist_ok=True)
        self.file_node = self.node(f"file://{served}")
        self.remote = run(walsvc.open_wal(self.file_node.url, "p0"))
        self.local = run(walsvc.open_wal(f"file://{copy}", "p0"))
        self.last: dict[str, MessageId] = {}
        self.records: dict[str, int] = {}
        self.messages: dict[str, int] = {}
        served_reader = run(walsvc.open_wal(f"file://{served}", "p0", read_only=True))
        try:
            for side, wal, reader in (
                ("remote", self.remote, served_reader),
                ("local", self.local, self.local),
            ):
                sentinel = Message(payload=PAYLOAD, vchannel=WANTED, idempotency_key="sentinel")
                last = self.last[side] = run(wal.append(sentinel)).message_id
                self.records[side] = run(read_until(reader, last, raw=True))
                self.messages[side] = run(read_until(reader, last))
                if self.messages[side] != LOG_RECORDS + 1:
                    raise AssertionError(f"{side}: {self.messages[side]} messages")
        finally:
            run(served_reader.aclose())

    def stop(self) -> None:
        for wal in (getattr(self, "remote", None), getattr(self, "local", None)):
            if wal is not None:
                self.loop.run_until_complete(wal.aclose())


class FilterCpu(_FilledLog):
    """Node CPU per record examined by a remote 1-of-16 filtered read, over this
    process's CPU per record of the same read embedded (lower is better)."""

    unit = "ratio"

    async def filtered(self, side: str) -> int:
        wal = self.remote if side == "remote" else self.local
        got = await read_until(wal, self.last[side], filters=[scanners.vchannel(WANTED)])
        if got != LOG_RECORDS // 16 + 1:
            raise AssertionError(f"the {side} filtered read delivered {got}")
        return got

    async def remote_cpu(self) -> float:
        pid = self.file_node.process.pid
        before = process_cpu(pid)
        await self.filtered("remote")
        return cpu_between(before, process_cpu(pid)) / self.records["remote"]

    async def local_cpu(self) -> float:
        before = time.process_time()
        await self.filtered("local")
        return (time.process_time() - before) / self.records["local"]

    def track_filter_cpu_ratio(self, loop: str) -> float:
        """Target <= 1.5."""
        local, remote = side_by_side(self.loop, REPEATS, self.local_cpu, self.remote_cpu)
        note(
            f"1-of-16 filtered read of {self.records['remote']} records: node"
            f" {[round(c * 1e9) for c in remote]} ns/record, embedded"
            f" {[round(c * 1e9) for c in local]} ns/record"
        )
        return min(remote) / min(local)


class CatchUp(_FilledLog):
    """One remote consumer reading the filled log from the start, over the same read
    embedded (msgs/s)."""

    unit = "ratio"

    async def rate(self, side: str) -> float:
        wal = self.remote if side == "remote" else self.local
        start = time.perf_counter()
        got = await read_until(wal, self.last[side])
        elapsed = time.perf_counter() - start
        if got != self.messages[side]:
            raise AssertionError(f"the {side} read delivered {got}, not {self.messages[side]}")
        return got / elapsed

    def track_catchup_consumer_ratio(self, loop: str) -> float:
        embedded, remote = side_by_side(
            self.loop, REPEATS, lambda: self.rate("local"), lambda: self.rate("remote")
        )
        count = self.messages["remote"]
        note(f"catch-up read of {count} messages: embedded {[round(r) for r in embedded]}")
        note(f"catch-up read of {count} messages: walsvc:// {[round(r) for r in remote]}")
        return max(remote) / max(embedded)


# -- 2. fan-out -----------------------------------------------------------------------

FAN_OUT = 64
FAN_OUT_PROCESSES = 4
#: The producer appends FAN_OUT_BATCH messages with one ``append_many`` every
#: FAN_OUT_BATCH / FAN_OUT_RATE seconds, FAN_OUT_SECONDS long.
FAN_OUT_RATE = 700.0
FAN_OUT_BATCH = 10
FAN_OUT_SECONDS = 1.5
#: A node busier than this (CPU / wall time) with FAN_OUT consumers is near saturation.
FAN_OUT_BUSY = 0.6


async def paced_batches(wal: walsvc.WAL, rate: float, batch: int, seconds: float) -> int:
    """``rate`` messages per second offered to ``wal`` as one ``append_many`` of ``batch``
    at a time, on a fixed schedule (open loop, every call counted) for ``seconds``;
    return the messages appended."""
    appended = 0

    async def operation(i: int) -> object:
        nonlocal appended
        appended += batch
        return await wal.append_many([message(appended + j) for j in range(batch)])

    await open_loop_latencies(
        operation, producers=1, rate=rate / batch, seconds=seconds, warmup=0.0
    )
    return appended


async def fan_out_run(node: NodeProcess, consumers: int, loop: str) -> tuple[float, float, int]:
    """Node CPU (s) from the first append until ``consumers`` remote consumers have the
    stop message, the node's busy share of that wall time, and the messages delivered."""
    pchannel = new_pchannel()
    wal = await walsvc.open_wal(node.url, pchannel, exactly_once=False)
    try:
        await wal.append(message(0))  # the node's WAL exists and is ready
        processes = min(consumers, FAN_OUT_PROCESSES)
        per_process = consumers // processes if processes else 0
        if processes * per_process != consumers:
            raise ValueError(f"{consumers} consumers do not split over {processes} processes")
        args = ("tail", node.url, pchannel, str(per_process), loop)
        async with client_processes(processes, *args) as children:
            await asyncio.sleep(0.2)  # the children's connections settle
            pid = node.process.pid
            before, wall = process_cpu(pid), time.perf_counter()
            appended = await paced_batches(wal, FAN_OUT_RATE, FAN_OUT_BATCH, FAN_OUT_SECONDS)
            await wal.append(Message(payload=stamped(STOP), vchannel=VCHANNELS[0]))
            results = await asyncio.gather(*(c.figures() for c in children))
            spent = cpu_between(before, process_cpu(pid))
            wall = time.perf_counter() - wall
        received = [n for r in results for n in r["received"]]
        if received != [appended] * consumers:
            raise AssertionError(f"consumers received {sorted(set(received))}, not {appended}")
        return spent, spent / wall, appended * consumers
    finally:
        await wal.aclose()


class FanOutCpu(FleetBench):
    """Node CPU per delivered message, 64 remote consumers over one (lower is better)."""

    unit = "ratio"

    def start(self) -> None:
        self.memory_node = self.node(f"memory://fan-out-{uuid.uuid4().hex[:6]}")

    def track_fanout_cpu_ratio(self, loop: str) -> float:
        """Target <= 2."""
        none, one, many = side_by_side(
            self.loop,
            REPEATS,
            lambda: fan_out_run(self.memory_node, 0, loop),
            lambda: fan_out_run(self.memory_node, 1, loop),
            lambda: fan_out_run(self.memory_node, FAN_OUT, loop),
        )
        for label, runs in (("0", none), ("1", one), (str(FAN_OUT), many)):
            note(
                f"fan-out, {label} consumers: node CPU {[round(r[0], 3) for r in runs]} s,"
                f" busy {[round(r[1], 2) for r in runs]} of a core, {runs[0][2]} delivered"
            )
        base = min(r[0] for r in none)
        cpu_one, delivered_one = min(r[0] for r in one), one[0][2]
        cpu_many, delivered_many = min(r[0] for r in many), many[0][2]
        literal = (cpu_many / delivered_many) / (cpu_one / delivered_one)
        per_one = (cpu_one - base) / delivered_one
        per_many = (cpu_many - base) / delivered_many
        note(
            f"fan-out: delivery {per_one * 1e6:.1f} us/msg (1), {per_many * 1e6:.1f} us/msg"
            f" ({FAN_OUT}); without subtracting the appends' CPU: ratio {literal:.3f}"
        )
        busy = min(r[1] for r in many)
        if busy > FAN_OUT_BUSY:
            note(f"fan-out: the node was {busy:.2f} of a core busy with {FAN_OUT} consumers:")
            note("  its deliveries batch up under load, so the 64 side is flattered")
        return per_many / per_one


FIGURES: Final = {
    "track_filter_cpu_ratio": FilterCpu,
    "track_fanout_cpu_ratio": FanOutCpu,
    "track_catchup_consumer_ratio": CatchUp,
}


def main(argv: Sequence[str] = ()) -> None:
    """Every figure once per loop (``_fleet.run_figures``)."""
    run_figures(FIGURES, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
