"""What tailing readers cost (issue 21, section 4): ``tail_costs``'s figures as asv
tracks.

Each figure runs ``python -m benchmarks.tail_costs FIGURE ARG ...`` in a fresh process
(from the repository root) and reads the JSON line it prints: the figures measure a whole
process (``/proc/self/io`` rchar, getrusage), so nothing of asv's process may count.
Three runs each, the best (lowest) counts; every run's figures go to stderr.

- ``TailAmplification.track_read_per_payload_byte``: a read-only WAL tails a log a
  child process writes (``sync="always"``; ``pace`` = ``paced``: one 100-byte message
  every 10 ms, ``full``: 64 producers back to back); bytes this process read per payload
  byte delivered (target <= 2 for ``paced``; stderr: per envelope byte too).
- ``TailFanOut.track_see_append_p99``: 1,000 tailing scanners of one read-only WAL, an
  in-process writer appending every 20 ms; p99 of the time from the append call until a
  scanner has it, ms (target <= 50).
- ``IdleTailing.track_cpu_share``: 10,000 scanners waiting at the end of a writer's log
  (tail cache on), nothing appended; CPU of the process over 5 s of wall time, as a share
  of one core (target <= 0.10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import timeit

from ._common import note

REPEATS = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def figures(name: str, *args: str) -> dict[str, float]:
    """One run of ``tail_costs.<name>(*args)`` in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.tail_costs", name, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"tail_costs {name} {' '.join(args)} failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def best(key: str, name: str, *args: str) -> float:
    """The lowest ``key`` of REPEATS runs of a figure."""
    runs = [figures(name, *args) for _ in range(REPEATS)]
    for run in runs:
        note(f"{name} {' '.join(args)}: {run}")
    return min(run[key] for run in runs)


class TailAmplification:
    """Bytes a tailing cross-process reader reads per payload byte it delivers."""

    params = (["paced", "full"],)
    param_names = ("pace",)
    timer = timeit.default_timer
    timeout = 600
    unit = "bytes read / payload byte"

    def track_read_per_payload_byte(self, pace: str) -> float:
        """``amplification("always", pace)``'s read_per_payload_byte (paced: <= 2)."""
        return best("read_per_payload_byte", "amplification", "always", pace)


class TailFanOut:
    """1,000 tailing readers of one read-only WAL: how late they see an append."""

    timer = timeit.default_timer
    timeout = 600
    unit = "ms"

    def track_see_append_p99(self) -> float:
        """``fan_out(1000)``'s see_append_p99_ms (target <= 50)."""
        return best("see_append_p99_ms", "fan_out", "1000")


class IdleTailing:
    """10,000 idle tailing scanners of one writer: CPU."""

    timer = timeit.default_timer
    timeout = 600
    unit = "share of a core"

    def track_cpu_share(self) -> float:
        """``idle_tailing(10000)``'s cpu_share_of_core (target <= 0.10)."""
        return best("cpu_share_of_core", "idle_tailing", "10000")
