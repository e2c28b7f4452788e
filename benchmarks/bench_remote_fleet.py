"""The node over the network (issue 23), the append targets bench_remote leaves out:
client processes appending together, and append -> remote visibility.

Every node is a subprocess (``python -m walsvc serve``, on loopback) started in
``setup`` and stopped by its pid in ``teardown``; its scratch directory goes with it
(``_fleet.FleetBench``). Parameter ``loop`` is every process's loop: this process, the
client processes (``benchmarks._fleet_client``) and the node. Payloads are 100 bytes;
the producers' carry the ``time.monotonic_ns()`` of the append call
(``_fleet_client.stamped``). Node CPU: ``_fleet.process_cpu``. Each figure runs both
sides alternately, three times each, and takes the best (highest rate, lowest CPU or
latency) of each side. The read targets: ``bench_remote_reads``.

- ``FleetAppend.track_append_4_processes_ratio``: 4 client processes, each with one
  connection and 16 producers awaiting ``append`` (``exactly_once`` default: producer
  keys), to a node over ``file://`` with ``--sync always``; all start at one instant sent
  on their stdin, warm up 0.2 s, then count the appends completed in 1 s; their sum per
  second over the same windowed count of 64 producers on an embedded ``file://`` WAL
  (``sync="always"``) in this process. Target >= 0.8. Stderr: CPU per append in the
  window of the node, of the 4 clients together and of the embedded process.
- ``Visibility.track_visibility_p99_ms``: a node over ``file://`` with ``--sync always``;
  64 paced producers in this process offer 10k msgs/s of ``append`` for 0.3 s of warm-up
  then 2 s, each payload stamped at the call; one remote consumer in a client process
  tails from ``latest``; p99 of (when its batch reached the consumer - stamp), in ms,
  over the messages of the 2 s. Target <= 20 ms. Stderr: p50, max, the achieved rate and
  the same figures of an embedded ``file://`` WAL (``sync="always"``) with the producers
  and a tailing consumer in this process, and the node's busy share (CPU / wall time).

Run alone: ``python -m benchmarks.bench_remote_fleet [FIGURE ...] [LOOP ...]`` prints
every figure (or those named, e.g. ``track_visibility_p99_ms``) for each loop (or those
named).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Final

import walsvc
from walsvc import DeliverPolicy, Message

from ._common import (
    REPEATS,
    VCHANNELS,
    note,
    open_loop_latencies,
    percentile,
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
from ._fleet_client import (
    MEASURED,
    STOP,
    UNMEASURED,
    at,
    consume,
    latency_summary,
    message,
    stamped,
    windowed_appends,
)
from .bench_remote import NodeProcess

# -- 1. four client processes appending ------------------------------------------------

FLEET_PROCESSES = 4
FLEET_PRODUCERS = 16
WARMUP = 0.2
SECONDS = 1.0


async def fleet_append_rate(node: NodeProcess, loop: str) -> float:
    """Appends/s of FLEET_PROCESSES client processes x FLEET_PRODUCERS producers on a
    fresh pchannel of ``node``, counted in one common window."""
    args = (
        *("append", node.url, new_pchannel()),
        *(str(FLEET_PRODUCERS), str(WARMUP), str(SECONDS), loop),
    )
    async with client_processes(FLEET_PROCESSES, *args) as children:
        start = time.monotonic() + 0.1
        for child in children:
            child.send(f"go {start!r}")
        await at(start + WARMUP)
        before = process_cpu(node.process.pid)
        await at(start + WARMUP + SECONDS)
        node_cpu = cpu_between(before, process_cpu(node.process.pid))
        results = await asyncio.gather(*(c.figures() for c in children))
    appended = sum(r["count"] for r in results)
    clients_cpu = sum(r["cpu"] for r in results)
    note(
        f"4 processes: appends in the window {[r['count'] for r in results]}; CPU per append:"
        f" node {node_cpu / appended * 1e6:.1f} us (busy {node_cpu / SECONDS:.2f}),"
        f" clients {clients_cpu / appended * 1e6:.1f} us"
    )
    return appended / SECONDS


async def embedded_append_rate(url: str, producers: int) -> float:
    """Appends/s of ``producers`` in this process on an embedded WAL at ``url``
    (``sync="always"``), counted in the same kind of window."""
    wal = await walsvc.open_wal(url, new_pchannel(), sync="always")
    try:
        await wal.append(message(0))

        async def operation(i: int) -> object:
            return await wal.append(message(i))

        count, cpu = await windowed_appends(
            operation,
            producers=producers,
            start=time.monotonic() + 0.005,
            warmup=WARMUP,
            seconds=SECONDS,
        )
        note(f"embedded: CPU per append {cpu / count * 1e6:.1f} us")
        return count / SECONDS
    finally:
        await wal.aclose()


class FleetAppend(FleetBench):
    """4 client processes x 16 producers to a node over file:// (sync always), over 64
    producers on an embedded file:// WAL."""

    unit = "ratio"

    def start(self) -> None:
        self.file_node = self.node(f"file://{self.scratch('fleet-node')}", "--sync", "always")
        self.local = f"file://{self.scratch('fleet-local')}"

    def track_append_4_processes_ratio(self, loop: str) -> float:
        """Target >= 0.8."""
        embedded, remote = side_by_side(
            self.loop,
            REPEATS,
            lambda: embedded_append_rate(self.local, FLEET_PROCESSES * FLEET_PRODUCERS),
            lambda: fleet_append_rate(self.file_node, loop),
        )
        note(f"append, file:// sync=always: embedded 64 {[round(r) for r in embedded]} msgs/s")
        note(f"append, file:// sync=always: 4 processes x 16 {[round(r) for r in remote]} msgs/s")
        return max(remote) / max(embedded)


# -- 2. visibility ----------------------------------------------------------------------

VISIBILITY_RATE = 10_000.0
VISIBILITY_PRODUCERS = 64
VISIBILITY_WARMUP = 0.3
VISIBILITY_SECONDS = 2.0


async def stamped_load(wal: walsvc.WAL) -> tuple[int, float, float]:
    """VISIBILITY_RATE appends/s offered to ``wal``, messages stamped MEASURED after the
    warm-up; returns the appends made, the achieved rate and the ack p99 (ms)."""
    measure_from = time.monotonic() + VISIBILITY_WARMUP
    appended = 0

    async def operation(i: int) -> object:
        nonlocal appended
        appended += 1
        flag = MEASURED if time.monotonic() >= measure_from else UNMEASURED
        return await wal.append(message(i, flag))

    latencies, achieved = await open_loop_latencies(
        operation,
        producers=VISIBILITY_PRODUCERS,
        rate=VISIBILITY_RATE,
        seconds=VISIBILITY_SECONDS,
        warmup=VISIBILITY_WARMUP,
    )
    await wal.append(Message(payload=stamped(STOP), vchannel=VCHANNELS[0]))
    return appended, achieved, percentile(latencies, 99) * 1e3


async def remote_visibility(node: NodeProcess, loop: str) -> dict[str, float]:
    pchannel = new_pchannel()
    wal = await walsvc.open_wal(node.url, pchannel)
    try:
        await wal.append(message(0))
        async with client_processes(1, "tail", node.url, pchannel, "1", loop) as (child,):
            before, wall = process_cpu(node.process.pid), time.perf_counter()
            appended, achieved, ack_p99 = await stamped_load(wal)
            busy = cpu_between(before, process_cpu(node.process.pid))
            busy /= time.perf_counter() - wall
            figures = await child.figures()
        if figures["received"] != [appended]:
            raise AssertionError(f"the consumer received {figures['received']} of {appended}")
        return {**figures, "achieved": achieved, "ack_p99_ms": ack_p99, "node_busy": busy}
    finally:
        await wal.aclose()


async def embedded_visibility(url: str) -> dict[str, float]:
    wal = await walsvc.open_wal(url, new_pchannel(), sync="always")
    try:
        await wal.append(message(0))
        latencies: list[int] = []
        scanner = wal.read(DeliverPolicy.latest())
        reading = asyncio.get_running_loop().create_task(consume(scanner, latencies))
        try:
            await asyncio.sleep(0.05)
            appended, achieved, ack_p99 = await stamped_load(wal)
            received = await reading
        finally:
            reading.cancel()
            await scanner.aclose()
        if received != appended:
            raise AssertionError(f"the consumer received {received} of {appended}")
        return {**latency_summary(latencies), "achieved": achieved, "ack_p99_ms": ack_p99}
    finally:
        await wal.aclose()


def _visibility_note(label: str, runs: list[dict[str, float]]) -> None:
    note(
        f"visibility at {VISIBILITY_RATE:.0f} msgs/s offered, {label}:"
        f" p99 {[round(r['p99_ms'], 2) for r in runs]} ms,"
        f" p50 {[round(r['p50_ms'], 2) for r in runs]} ms,"
        f" max {[round(r['max_ms'], 1) for r in runs]} ms,"
        f" achieved {[round(r['achieved']) for r in runs]} msgs/s,"
        f" ack p99 {[round(r['ack_p99_ms'], 2) for r in runs]} ms"
        + (
            f", node busy {[round(r['node_busy'], 2) for r in runs]}"
            if "node_busy" in runs[0]
            else ""
        )
    )


class Visibility(FleetBench):
    """Append -> remote consumer at 10k msgs/s, node over file:// (sync always), ms."""

    unit = "ms"

    def start(self) -> None:
        self.file_node = self.node(f"file://{self.scratch('vis-node')}", "--sync", "always")
        self.local = f"file://{self.scratch('vis-local')}"

    def track_visibility_p99_ms(self, loop: str) -> float:
        """Target <= 20 ms."""
        embedded, remote = side_by_side(
            self.loop,
            REPEATS,
            lambda: embedded_visibility(self.local),
            lambda: remote_visibility(self.file_node, loop),
        )
        _visibility_note("embedded", embedded)
        _visibility_note("walsvc://", remote)
        return min(r["p99_ms"] for r in remote)


FIGURES: Final = {
    "track_append_4_processes_ratio": FleetAppend,
    "track_visibility_p99_ms": Visibility,
}


def main(argv: Sequence[str] = ()) -> None:
    """Every figure once per loop (``_fleet.run_figures``)."""
    run_figures(FIGURES, argv)


if __name__ == "__main__":
    main(sys.argv[1:])
