"""What 1,000 idle pchannels cost (issue 21, section 4): ``tail_costs.idle_pchannels``.

Each run is a process of its own (``python -m benchmarks.tail_costs idle_pchannels 1000
APPENDED``): 1,000 file WALs open read-write with the default chain, nothing appended
(``appended`` = "0") or one message appended to each first ("1": every WAL has had its
commit thread), then 1 s to settle and 5 s idle. Figures: the process's CPU (every
thread) over those 5 s as a share of one core, the RSS the WALs added, and the threads
left. Three runs per parameter (made once, in ``setup_cache``); each figure is the best
(lowest) of the three: noise on this shared machine only ever adds.

Targets: <= 0.05 of a core and <= 200 MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ._common import note

COUNT = "1000"
APPENDED = ("0", "1")
REPEATS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(appended: str) -> dict[str, float]:
    """One ``idle_pchannels`` run in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.tail_costs", "idle_pchannels", COUNT, appended],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


class IdlePchannels:
    params = (list(APPENDED),)
    param_names = ("appended",)
    timeout = 600

    def setup_cache(self) -> dict[str, list[dict[str, float]]]:
        runs: dict[str, list[dict[str, float]]] = {appended: [] for appended in APPENDED}
        for _ in range(REPEATS):  # alternately, so drift in the machine's load hits both
            for appended in APPENDED:
                figures = run_once(appended)
                note(f"idle_pchannels appended={appended}: {figures}")
                runs[appended].append(figures)
        return runs

    def track_cpu_share(self, runs: dict[str, list[dict[str, float]]], appended: str) -> float:
        return min(r["cpu_share_of_core"] for r in runs[appended])

    track_cpu_share.unit = "share of a core"  # type: ignore[attr-defined]

    def track_rss_mib(self, runs: dict[str, list[dict[str, float]]], appended: str) -> float:
        return min(r["rss_mib"] for r in runs[appended])

    track_rss_mib.unit = "MiB"  # type: ignore[attr-defined]

    def track_threads(self, runs: dict[str, list[dict[str, float]]], appended: str) -> float:
        return min(r["threads"] for r in runs[appended])

    track_threads.unit = "threads"  # type: ignore[attr-defined]
