"""What tailing readers and idle pchannels cost (issue 21, section 4), as a script.

    python -m benchmarks.tail_costs FIGURE [ARG ...]

Each figure runs in its own process and prints one JSON dict; ``benchmarks.ab`` runs
these functions on two source trees alternately (before and after in one run):

- ``amplification()``: a writer in a child process appends 100-byte messages (64
  producers, ``sync`` as given) for ``SECONDS``; a read-only WAL in this process tails
  the log with one scanner from ``latest``. Bytes this process read (``rchar`` of
  /proc/self/io: every read and pread) per byte delivered in ``WINDOW`` seconds, counting
  payloads and, separately, envelopes (fixed header, vchannel, payload; the ext section
  and frame headers not counted). ``amplification(sync, "paced")``: the writer appends
  one message every 10 ms instead.
- ``fan_out(readers)``: ``readers`` scanners of a read-only WAL tail the log (no tail
  cache) while a writer in this process (``sync="none"``) appends one message every
  20 ms; for each append, the time from the call until each reader has it; p50/p99/max
  in ms, plus RSS, threads and open descriptors with the readers waiting.
- ``idle_pchannels(count, appended="0")``: ``count`` file WALs open read-write (default
  chain), nothing appended (``appended="1"``: one message appended to each first, so
  each has had its commit thread); CPU (user + system of the process, every thread, from
  getrusage) over ``IDLE_SECONDS`` of wall time, as a share of one core; RSS, threads and
  descriptors.
- ``idle_tailing(count)``: a writer (file://, default chain) with ``count`` scanners
  waiting at the end of its log (tail cache on), nothing appended; CPU share as above.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time

import walsvc
from walsvc import DeliverPolicy, Message

from ._common import PAYLOAD, VCHANNELS, percentile, remove_dir, scratch_dir

SECONDS = 2.0
#: The reader measures this long from the first message it gets (the writer runs
#: SECONDS from its open).
WINDOW = 1.5
IDLE_SECONDS = 5.0


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def _status() -> dict[str, float]:
    out: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                out["rss_mib"] = int(value.split()[0]) / 1024
            elif key == "Threads":
                out["threads"] = int(value)
    out["fds"] = len(os.listdir("/proc/self/fd"))
    return out


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _write_for(url: str, seconds: float, sync: str, pace: str) -> None:
    async with await walsvc.open_wal(url, "p0", sync=sync) as wal:
        end = time.perf_counter() + seconds

        async def produce(i: int) -> None:
            message = Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16])
            while time.perf_counter() < end:
                await wal.append(message)
                if pace == "paced":
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(produce(i) for i in range(1 if pace == "paced" else 64)))


def writer_child(directory: str, seconds: str, sync: str, pace: str) -> None:
    """The child process of ``amplification``."""
    asyncio.run(_write_for(f"file://{directory}", float(seconds), sync, pace))


def amplification(sync: str = "always", pace: str = "full") -> dict[str, float]:
    directory = scratch_dir("amplification")
    url = f"file://{directory}"
    try:

        async def run() -> dict[str, float]:
            async with await walsvc.open_wal(url, "p0", sync=sync):
                pass  # the log exists, with its opening TimeTick
            reader = await walsvc.open_wal(url, "p0", read_only=True)
            scanner = reader.read(DeliverPolicy.latest())
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                "import sys; from benchmarks.tail_costs import writer_child;"
                " writer_child(*sys.argv[1:])",
                directory,
                str(SECONDS),
                sync,
                pace,
                cwd=os.getcwd(),
            )
            # Measured from the first message for WINDOW seconds, while the child still
            # writes: a child's reads count as its parent's once it is reaped.
            first = await scanner.__anext__()
            payload = envelope = delivered = 0
            before, start = _rchar(), time.perf_counter()
            try:
                async with asyncio.timeout(WINDOW):
                    async for message in scanner:
                        delivered += 1
                        payload += len(message.payload)
                        envelope += 36 + len(message.vchannel.encode()) + len(message.payload)
            except TimeoutError:
                pass
            finally:
                read = _rchar() - before
                elapsed = time.perf_counter() - start
                await scanner.aclose()
                await reader.aclose()
                await child.wait()
            assert first is not None
            assert elapsed < SECONDS
            return {
                "delivered": delivered,
                "bytes_read": read,
                "read_per_payload_byte": read / max(payload, 1),
                "read_per_envelope_byte": read / max(envelope, 1),
            }

        return asyncio.run(run())
    finally:
        remove_dir(directory)


def fan_out(readers: str = "1000") -> dict[str, float]:
    count = int(readers)
    directory = scratch_dir("fan-out")
    url = f"file://{directory}"
    try:

        async def run() -> dict[str, float]:
            writer = await walsvc.open_wal(url, "p0", sync="none")
            await writer.append(Message(payload=PAYLOAD, vchannel="v0"))
            reader = await walsvc.open_wal(url, "p0", read_only=True)
            latencies: list[float] = []
            called: dict[bytes, float] = {}
            appends = 20
            status: dict[str, float] = {}

            async def tail() -> None:
                seen = 0
                async with reader.read(DeliverPolicy.latest()) as scanner:
                    async for message in scanner:
                        if message.payload not in called:
                            continue  # the first message, TimeTicks
                        latencies.append(time.perf_counter() - called[message.payload])
                        seen += 1
                        if seen == appends:
                            return

            tasks = [asyncio.ensure_future(tail()) for _ in range(count)]
            await asyncio.sleep(1.0)  # every reader waits at the end
            status.update(_status())
            for i in range(appends):
                payload = b"%d" % i
                called[payload] = time.perf_counter()
                await writer.append(Message(payload=payload, vchannel="v0"))
                await asyncio.sleep(0.02)
            async with asyncio.timeout(120):
                await asyncio.gather(*tasks)
            await reader.aclose()
            await writer.aclose()
            ms = [x * 1000 for x in latencies]
            return {
                "see_append_p50_ms": percentile(ms, 50),
                "see_append_p99_ms": percentile(ms, 99),
                "see_append_max_ms": max(ms),
                **status,
            }

        return asyncio.run(run())
    finally:
        remove_dir(directory)


def idle_pchannels(count: str = "1000", appended: str = "0") -> dict[str, float]:
    n = int(count)
    directory = scratch_dir("idle-pchannels")
    url = f"file://{directory}"
    try:

        async def run() -> dict[str, float]:
            before = _status()
            wals = [await walsvc.open_wal(url, f"p{i}") for i in range(n)]
            if appended == "1":
                await asyncio.gather(
                    *(wal.append(Message(payload=PAYLOAD, vchannel="v0")) for wal in wals)
                )
            await asyncio.sleep(1.0)
            cpu, wall = _cpu(), time.perf_counter()
            await asyncio.sleep(IDLE_SECONDS)
            share = (_cpu() - cpu) / (time.perf_counter() - wall)
            after = _status()
            for wal in wals:
                await wal.aclose()
            return {
                "cpu_share_of_core": share,
                "rss_mib": after["rss_mib"] - before["rss_mib"],
                "threads": after["threads"],
                "fds": after["fds"],
            }

        return asyncio.run(run())
    finally:
        remove_dir(directory)


def idle_tailing(count: str = "10000") -> dict[str, float]:
    n = int(count)
    directory = scratch_dir("idle-tailing")
    url = f"file://{directory}"
    try:

        async def run() -> dict[str, float]:
            wal = await walsvc.open_wal(url, "p0")
            await wal.append(Message(payload=PAYLOAD, vchannel="v0"))

            async def tail() -> None:
                async with wal.read(DeliverPolicy.latest()) as scanner:
                    async for message in scanner:
                        if message.payload == b"stop":
                            return

            tasks = [asyncio.ensure_future(tail()) for _ in range(n)]
            await asyncio.sleep(1.0)
            cpu, wall = _cpu(), time.perf_counter()
            await asyncio.sleep(IDLE_SECONDS)
            share = (_cpu() - cpu) / (time.perf_counter() - wall)
            status = _status()
            await wal.append(Message(payload=b"stop", vchannel="v0"))
            async with asyncio.timeout(120):
                await asyncio.gather(*tasks)
            await wal.aclose()
            return {"cpu_share_of_core": share, **status}

        return asyncio.run(run())
    finally:
        remove_dir(directory)


def main() -> None:
    figure, *args = sys.argv[1:]
    print(json.dumps(globals()[figure](*args)))


if __name__ == "__main__":
    main()
