"""The node over the network (issue 23): a client appending and reading over
``walsvc://`` against the same work on an embedded WAL, side by side in one run.

The node is a subprocess (``python -m walsvc serve``) on loopback, started per
benchmark in ``setup`` and stopped by its pid in ``teardown`` (Linux sends it SIGTERM if
the benchmark process dies first); the client runs on the benchmark's loop. Payloads are
100 bytes.

- ``track_append_64_producers_ratio``: 64 producers in one client each awaiting
  ``append`` to a node over ``file://`` with ``sync="always"``, over 64 producers on an
  embedded ``file://`` WAL with ``sync="always"``.
- ``track_append_many_100_ratio``: one producer awaiting ``append_many`` of 100 over
  ``walsvc://`` (node on ``memory://``), over the same on an embedded ``memory://`` WAL.
- ``track_tailing_consumer_ratio``: one remote reader tailing while a remote producer
  appends batches of 100 (node on ``memory://``): messages/s the reader received, over an
  embedded ``memory://`` reader tailing the same way. The reader cannot receive faster
  than the remote producer appends (the producer's ``append_many`` rate bounds it), so
  this is the pair's rate; ``bench_remote_reads``'s catch-up ratio measures delivery on
  its own.

Run alone: ``python -m benchmarks.bench_remote`` prints every figure.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

import walsvc
from walsvc import DeliverPolicy, Message

from ._common import (
    LOOPS,
    PAYLOAD,
    PRODUCERS,
    VCHANNELS,
    best_ratio,
    child_environment,
    close_loop,
    closed_loop_rate,
    new_loop,
    remove_dir,
    scratch_dir,
)

SECONDS = 0.5
WARMUP = 0.1
BATCH = 100
TAIL_MESSAGES = 100_000
ROOT = Path(__file__).resolve().parent.parent


#: ``python -m walsvc`` in a process that dies with the benchmark (``die_with_parent``);
#: with ``WALSVC_BENCH_NODE_LOOP=asyncio`` uvloop cannot be imported, so the node runs the
#: stock asyncio loop.
_NODE_MAIN = (
    "import os, sys; from benchmarks._common import die_with_parent; die_with_parent();"
    " os.environ.get('WALSVC_BENCH_NODE_LOOP') == 'asyncio' and sys.modules.update(uvloop=None);"
    " from walsvc.apps._cli import main; sys.exit(main(sys.argv[1:]))"
)


class NodeProcess:
    """``walsvc serve`` in a subprocess; ``url`` is the node's ``walsvc://`` URL. The
    node gets SIGTERM if this process dies without stopping it. ``loop="asyncio"`` runs
    it on the stock asyncio loop instead of its default, uvloop."""

    def __init__(self, log_url: str, *extra: str, loop: str = "uvloop") -> None:
        environment = child_environment()
        if loop == "asyncio":
            environment["WALSVC_BENCH_NODE_LOOP"] = "asyncio"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _NODE_MAIN,
                "serve",
                "--url",
                log_url,
                "--listen",
                "127.0.0.1:0",
                *extra,
            ],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if " at walsvc://" not in line:
            self.close()
            raise RuntimeError(f"the node did not start: {line!r}")
        self.url = line.rsplit(" at ", 1)[1].strip()

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _message(i: int) -> Message:
    return Message(payload=PAYLOAD, vchannel=VCHANNELS[i % len(VCHANNELS)])


async def append_rate(url: str, producers: int, batch: int, **options: Any) -> float:
    """Messages/s of ``producers`` coroutines appending to a fresh pchannel of ``url``."""
    wal = await walsvc.open_wal(url, f"p-{uuid.uuid4().hex[:8]}", **options)
    try:
        if batch == 1:

            async def operation(i: int) -> object:
                return await wal.append(_message(i))
        else:
            many = [_message(i) for i in range(batch)]

            async def operation(i: int) -> object:
                return await wal.append_many(many)

        await closed_loop_rate(operation, producers=producers, seconds=WARMUP, items_per_call=batch)
        return await closed_loop_rate(
            operation, producers=producers, seconds=SECONDS, items_per_call=batch
        )
    finally:
        await wal.aclose()


async def tail_rate(url: str) -> float:
    """Messages/s one reader (``DeliverPolicy.latest()``) receives while a producer on
    another handle appends ``TAIL_MESSAGES`` in batches of ``BATCH``."""
    pchannel = f"p-{uuid.uuid4().hex[:8]}"
    writer = await walsvc.open_wal(url, pchannel)
    reader = writer if url.startswith("memory://") else await walsvc.open_wal(url, pchannel)
    scanner = reader.read(DeliverPolicy.latest())
    many = [_message(i) for i in range(BATCH)]

    async def produce() -> None:
        for _ in range(TAIL_MESSAGES // BATCH):
            await writer.append_many(many)

    try:
        await writer.append(_message(0))  # the scanner is open on the node from here on
        producing = asyncio.get_running_loop().create_task(produce())
        received, first = 0, None
        async with asyncio.timeout(120):
            async for batch in scanner.batches():
                if first is None:
                    first = time.perf_counter()
                received += len(batch)
                if received >= TAIL_MESSAGES + 1:
                    break
        elapsed = time.perf_counter() - (first or 0.0)
        await producing
        return received / elapsed
    finally:
        await scanner.aclose()
        if reader is not writer:
            await reader.aclose()
        await writer.aclose()


class RemoteRatio:
    """walsvc:// over the embedded WAL; the node runs in a subprocess per benchmark."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 300
    unit = "ratio"

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)
        self.dirs = [scratch_dir("remote-node"), scratch_dir("remote-local")]
        self.file_node = NodeProcess(f"file://{self.dirs[0]}", "--sync", "always")
        self.memory_node = NodeProcess(f"memory://bench-{uuid.uuid4().hex[:6]}")

    def teardown(self, loop: str) -> None:
        try:
            close_loop(self.loop)
        finally:
            self.file_node.close()
            self.memory_node.close()
            for directory in self.dirs:
                remove_dir(directory)

    def track_append_64_producers_ratio(self, loop: str) -> float:
        local = f"file://{self.dirs[1]}"
        return best_ratio(
            self.loop,
            "64 producers, file:// sync=always",
            ("embedded", lambda: append_rate(local, PRODUCERS, 1, sync="always")),
            ("walsvc://", lambda: append_rate(self.file_node.url, PRODUCERS, 1)),
        )

    def track_append_many_100_ratio(self, loop: str) -> float:
        local = f"memory://local-{uuid.uuid4().hex[:6]}"
        return best_ratio(
            self.loop,
            "append_many x100, memory://",
            ("embedded", lambda: append_rate(local, 1, BATCH)),
            ("walsvc://", lambda: append_rate(self.memory_node.url, 1, BATCH)),
        )

    def track_tailing_consumer_ratio(self, loop: str) -> float:
        local = f"memory://local-{uuid.uuid4().hex[:6]}"
        return best_ratio(
            self.loop,
            "one tailing consumer, memory://",
            ("embedded", lambda: tail_rate(local)),
            ("walsvc://", lambda: tail_rate(self.memory_node.url)),
        )


def main() -> None:
    """Every figure once per loop, on stderr (``[walsvc-bench]`` lines), ratios on stdout."""
    for loop in LOOPS:
        bench = RemoteRatio()
        bench.setup(loop)
        try:
            for name in (
                "track_append_64_producers_ratio",
                "track_append_many_100_ratio",
                "track_tailing_consumer_ratio",
            ):
                print(f"{loop} {name}: {getattr(bench, name)(loop):.3f}", flush=True)
        finally:
            bench.teardown(loop)


if __name__ == "__main__":
    main()
