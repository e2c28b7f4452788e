"""What the benchmarks of the node with client processes share (``bench_remote_fleet``,
``bench_remote_reads``): a node process's CPU read from ``/proc``, client processes
(``benchmarks._fleet_client``) driven over their stdin and stdout, the benchmark class
that starts nodes and scratch directories and stops them, and the run-alone main.

Node CPU is the node process's run time, every thread, read from
``/proc/PID/task/*/schedstat`` (ns; utime + stime of ``/proc/PID/stat`` if a thread
ended in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import timeit
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import walsvc

from ._common import LOOPS, child_environment, close_loop, new_loop, note, remove_dir, scratch_dir
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


def new_pchannel() -> str:
    """A pchannel name of its own."""
    return f"p-{uuid.uuid4().hex[:8]}"


# -- the benchmark class -------------------------------------------------------------


class FleetBench:
    """An asv benchmark class of its own loop (parameter ``loop``) whose ``start`` starts
    node processes (``node``) and makes scratch directories (``scratch``): all stopped
    and removed in ``teardown``, also when ``start`` fails."""

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


def run_figures(figures: Mapping[str, type[FleetBench]], argv: Sequence[str] = ()) -> None:
    """Every figure of ``figures`` (name: benchmark class) once per loop, each run's
    figures on stderr (``[walsvc-bench]`` lines), the figure and the time it took on
    stdout. Arguments narrow it down: figure names (``track_filter_cpu_ratio``) and
    loops (``uvloop``)."""
    loops = [a for a in argv if a in LOOPS] or list(LOOPS)
    names = [a for a in argv if a not in LOOPS] or list(figures)
    unknown = set(names) - figures.keys()
    if unknown:
        raise SystemExit(f"unknown figures {sorted(unknown)}; known: {list(figures)}")
    for loop in loops:
        for name in names:
            bench = figures[name]()
            began = time.perf_counter()
            bench.setup(loop)
            try:
                figure = getattr(bench, name)(loop)
            finally:
                bench.teardown(loop)
            took = time.perf_counter() - began
            print(f"{loop} {name}: {figure:.3f} ({took:.1f} s)", flush=True)
