"""The node over the network (issue 23), the targets bench_remote leaves out: client
processes appending together, what a filtered read and a fan-out cost the node, append ->
remote visibility, and catch-up delivery on its own.

Every node is a subprocess (``python -m walsvc serve``, on loopback) started in
``setup`` and stopped by its pid in ``teardown``; its scratch directory goes with it.
Parameter ``loop`` is every process's loop: this process, the client processes
(``benchmarks._fleet_client``) and the node. Payloads are 100 bytes; the producers'
carry the ``time.monotonic_ns()`` of the append call (``_fleet_client.stamped``). Node CPU
is the node process's run time, every thread, read from ``/proc/PID/task/*/schedstat``
(ns; utime + stime of ``/proc/PID/stat`` if a thread ended in between). Each figure runs
both sides alternately, three times each, and takes the best (highest rate, lowest CPU
or latency) of each side.

- ``FleetAppend.track_append_4_processes_ratio``: 4 client processes, each with one
  connection and 16 producers awaiting ``append`` (``exactly_once`` default: producer
  keys), to a node over ``file://`` with ``--sync always``; all start at one instant sent
  on their stdin, warm up 0.2 s, then count the appends completed in 1 s; their sum per
  second over the same windowed count of 64 producers on an embedded ``file://`` WAL
  (``sync="always"``) in this process. Target >= 0.8. Stderr: CPU per append in the
  window of the node, of the 4 clients together and of the embedded process.
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
- ``Visibility.track_visibility_p99_ms``: a node over ``file://`` with ``--sync always``;
  64 paced producers in this process offer 10k msgs/s of ``append`` for 0.3 s of warm-up
  then 2 s, each payload stamped at the call; one remote consumer in a client process
  tails from ``latest``; p99 of (when its batch reached the consumer - stamp), in ms,
  over the messages of the 2 s. Target <= 20 ms. Stderr: p50, max, the achieved rate and
  the same figures of an embedded ``file://`` WAL (``sync="always"``) with the producers
  and a tailing consumer in this process, and the node's busy share (CPU / wall time).
- ``CatchUp.track_catchup_consumer_ratio``: the log and copy of ``FilterCpu``;
  messages/s one remote consumer receives reading the log with
  ``read(DeliverPolicy.all())`` from the ``read`` call until the sentinel, over the same
  read of the copy by the embedded WAL. This is delivery on its own: bench_remote's
  tailing ratio is bounded by its remote producer.

Run alone: ``python -m benchmarks.bench_remote_fleet [FIGURE ...] [LOOP ...]`` prints
every figure (or those named, e.g. ``track_filter_cpu_ratio``) for each loop (or those
named).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
import timeit
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import scanners
import walsvc
from walsvc import DeliverPolicy, Message, MessageId

from ._common import (
    LOOPS,
    PAYLOAD,
    REPEATS,
    STALL_SECONDS,
    VCHANNELS,
    child_environment,
    close_loop,
    new_loop,
    note,
    open_loop_latencies,
    percentile,
    remove_dir,
    scratch_dir,
    side_by_side,
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
from .bench_remote import ROOT, NodeProcess

#: Seconds a client process may take to start, or to report once its work is done.
CHILD_SECONDS: Final = 60.0

# -- node CPU -------------------------------------------------------------------------

_TICKS: Final = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> tuple[dict[int, int], float]:
    """A sample of process ``pid``'s CPU: each thread's run time (ns, schedstat) and the
    process's utime + stime (seconds, clock ticks)."""
    threads: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                threads[int(tid)] = int(f.read().split()[0])
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    # Fields 14 and 15 (utime, stime); the split starts at field 3 (state).
    return threads, (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_between(before: tuple[dict[int, int], float], after: tuple[dict[int, int], float]) -> float:
    """Seconds of CPU between two ``process_cpu`` samples: exact while every thread of the
    first is alive at the second, else to the clock tick."""
    (threads0, coarse0), (threads1, coarse1) = before, after
    if threads0.keys() <= threads1.keys():
        return (sum(threads1.values()) - sum(threads0.values())) / 1e9
    return coarse1 - coarse0


# -- client processes -------------------------------------------------------------------


class ClientProcess:
    """A ``benchmarks._fleet_client`` child: lines on its stdout, commands on its stdin."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, *args: str) -> ClientProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks._fleet_client",
            *args,
            cwd=ROOT,
            env=child_environment(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def line(self) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(CHILD_SECONDS):
            line = await self.process.stdout.readline()
        if not line:
            code = await self.process.wait()
            raise RuntimeError(f"client process {self.process.pid} exited ({code})")
        return line.decode().strip()

    async def ready(self) -> None:
        line = await self.line()
        if line != "ready":
            raise RuntimeError(f"client process {self.process.pid} said {line!r}")

    async def figures(self) -> dict[str, Any]:
        figures: dict[str, Any] = json.loads(await self.line())
        return figures

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())

    async def close(self) -> None:
        """Close its stdin (a tail child then disconnects and exits); kill it if it has
        not exited within 10 s."""
        process = self.process
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def client_processes(count: int, *args: str) -> Any:
    """``count`` client processes started with ``args``, ready; closed on the way out
    (killed at once if the block raised, else if they take more than 10 s)."""
    children: list[ClientProcess] = []
    try:
        while len(children) < count:  # one at a time: those started are closed on failure
            children.append(await ClientProcess.start(*args))
        await asyncio.gather(*(c.ready() for c in children))
        yield children
    except BaseException:
        for child in children:
            if child.process.returncode is None:
                child.process.kill()
        raise
    finally:
        await asyncio.gather(*(c.close() for c in children))


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


# -- 1. four client processes appending ------------------------------------------------

FLEET_PROCESSES = 4
FLEET_PRODUCERS = 16
WARMUP = 0.2
SECONDS = 1.0


async def fleet_append_rate(node: NodeProcess, loop: str) -> float:
    """Appends/s of FLEET_PROCESSES client processes x FLEET_PRODUCERS producers on a
    fresh pchannel of ``node``, counted in one common window."""
    args = (
        *("append", node.url, _pchannel()),
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
    wal = await walsvc.open_wal(url, _pchannel(), sync="always")
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


class _Bench:
    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 240
    loop_kind: str
    loop: asyncio.AbstractEventLoop
    nodes: list[NodeProcess]
    dirs: list[str]

    def setup(self, loop: str) -> None:
        imported = Path(walsvc.__file__).resolve().parent.parent
        if imported != ROOT:
            # asv runs benchmarks from a temporary directory with PYTHONPATH cleared: a
            # worktree's benchmarks import the editable install's walsvc there, while
            # the nodes and client processes (cwd ROOT) import ROOT's.
            note(f"this process runs walsvc from {imported}, the nodes and clients {ROOT}")
        self.nodes, self.dirs = [], []
        self.loop_kind = loop
        self.loop = new_loop(loop)
        try:
            self.start()
        except BaseException:
            self.teardown(loop)
            raise

    def start(self) -> None:
        """Start this benchmark's nodes (``self.node``), build what it needs."""

    def node(self, log_url: str, *extra: str) -> NodeProcess:
        node = NodeProcess(log_url, *extra, loop=self.loop_kind)
        self.nodes.append(node)
        return node

    def scratch(self, tag: str) -> str:
        directory = scratch_dir(tag)
        self.dirs.append(directory)
        return directory

    def stop(self) -> None:
        """Close what ``start`` opened in this process (before the loop closes)."""

    def teardown(self, loop: str) -> None:
        try:
            try:
                if not self.loop.is_closed():
                    self.stop()
            finally:
                close_loop(self.loop)
        finally:
            for node in self.nodes:
                node.close()
            for directory in self.dirs:
                remove_dir(directory)


class FleetAppend(_Bench):
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


# -- 2 and 5. a filled log read from the start -------------------------------------------

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


class _FilledLog(_Bench):
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


# -- 3. fan-out -----------------------------------------------------------------------

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
    pchannel = _pchannel()
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


class FanOutCpu(_Bench):
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


# -- 4. visibility ----------------------------------------------------------------------

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
    pchannel = _pchannel()
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
    wal = await walsvc.open_wal(url, _pchannel(), sync="always")
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


class Visibility(_Bench):
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
    "track_filter_cpu_ratio": FilterCpu,
    "track_fanout_cpu_ratio": FanOutCpu,
    "track_visibility_p99_ms": Visibility,
    "track_catchup_consumer_ratio": CatchUp,
}


def main(argv: Sequence[str] = ()) -> None:
    """Every figure once per loop, each run's figures on stderr (``[walsvc-bench]``
    lines), the figure and the time it took on stdout. Arguments narrow it down: figure
    names (``track_filter_cpu_ratio``) and loops (``uvloop``)."""
    loops = [a for a in argv if a in LOOPS] or list(LOOPS)
    names = [a for a in argv if a not in LOOPS] or list(FIGURES)
    unknown = set(names) - FIGURES.keys()
    if unknown:
        raise SystemExit(f"unknown figures {sorted(unknown)}; known: {list(FIGURES)}")
    for loop in loops:
        for name in names:
            bench = FIGURES[name]()
            began = time.perf_counter()
            bench.setup(loop)
            try:
                figure = getattr(bench, name)(loop)
            finally:
                bench.teardown(loop)
            took = time.perf_counter() - began
            print(f"{loop} {name}: {figure:.3f} ({took:.1f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
