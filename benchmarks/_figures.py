"""Figures for ``benchmarks.ab`` (before and after on two source trees): each function
measures with the benchmark modules of the tree it runs in and returns a dict.

Copy this file into a base tree that lacks it; it uses only what the benchmark modules
had before issue 21.
"""

from __future__ import annotations

import asyncio
import os

import walsvc

from . import bench_scan, bench_scanners
from ._common import close_loop, new_loop, side_by_side


def scan_figures(directory: str, loop_kind: str = "uvloop") -> dict[str, float]:
    """bench_scan's filtered scan and decode-all rates on the 400k log in ``directory``
    (built there if missing), best of three each, alternately, and bench_scanners's
    filtered replay (built under ``directory``/replay); records/s."""
    directory = os.path.abspath(directory)
    if not os.path.exists(os.path.join(directory, "p0", "head")):
        asyncio.run(bench_scan.build_log(directory))
    replay_dir = os.path.join(directory, "replay")
    if not os.path.exists(os.path.join(replay_dir, "p0", "head")):
        asyncio.run(bench_scanners.build_replay_log(replay_dir))
    loop = new_loop(loop_kind)
    try:
        wal = loop.run_until_complete(walsvc.open_wal(f"file://{directory}", "p0", read_only=True))
        replay_wal = loop.run_until_complete(
            walsvc.open_wal(f"file://{replay_dir}", "p0", read_only=True)
        )
        log = loop.run_until_complete(_replay_counts(replay_wal))
        filtered, full, replay = side_by_side(
            loop,
            3,
            lambda: bench_scan.filtered_scan(wal),
            lambda: bench_scan.decode_all_scan(wal),
            lambda: bench_scanners.filtered_replay(replay_wal, log),
        )
        loop.run_until_complete(wal.aclose())
        loop.run_until_complete(replay_wal.aclose())
    finally:
        close_loop(loop)
    return {
        "filtered_rate": max(filtered),
        "decode_all_rate": max(full),
        "filtered_vs_decode_all_rate": max(filtered) / max(full),
        "replay_rate": max(replay),
    }


async def _replay_counts(wal: walsvc.WAL) -> tuple[int, int, int]:
    """(records, "v3" messages, broadcasts) of the replay log, by a raw read."""
    records = wanted = broadcasts = 0
    end = await wal.latest_message_id()
    async with wal.read(raw=True) as scanner:
        async for message in scanner:
            records += 1
            if message.vchannel == bench_scanners.WANTED:
                wanted += 1
            elif message.vchannel == "":
                broadcasts += 1
            if message.message_id == end:
                break
    return records, wanted, broadcasts
