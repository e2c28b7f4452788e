"""pulsar-client's heap under churning readers: the regression test of how walsvc makes
its Pulsar readers.

pulsar-client's asynchronous reader calls (``create_reader_async``,
``has_message_available_async``, ``close_async``) corrupted its heap when many
short-lived readers were created, read a little and closed (see ARCHITECTURE.md, "The
Pulsar read path", and docs/pulsar-heap-corruption.md). ``start_at_timetick`` does
exactly that: each probe of its search is such a reader. So each run below is a child
``pytest tests/test_pulsar_seek.py`` whose readers have a receiver queue of 10 instead
of 1000 (``_small_reader_queues``), which makes the corruption show far more often,
checked for a clean exit. ``WALSVC_SOAK=N`` (``make soak``): N runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

#: Runs of the child (``make soak`` sets ``WALSVC_SOAK``).
RUNS = int(os.environ.get("WALSVC_SOAK", "1"))
#: Seconds one child may take (about 25 s on a loaded machine).
CHILD_LIMIT = 300

TESTS = Path(__file__).parent


def _describe(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"


@pytest.mark.slow
def test_churning_readers_with_small_queues_keep_the_heap_intact() -> None:
    """Each child builds two logs of about 3000 batched messages and runs the seek check
    on each (a few hundred readers made, read and closed), with its own broker. A child
    that crashes (a corrupted heap: SIGABRT or SIGSEGV) or fails fails the test with its
    output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    for run in range(RUNS):
        child = subprocess.run(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "pytest",
                "-n",
                "0",
                "-q",
                "-p",
                "no:randomly",
                "-p",
                "no:cacheprovider",
                "-p",
                "_small_reader_queues",
                str(TESTS / "test_pulsar_seek.py"),
            ],
            cwd=TESTS.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_LIMIT,
            check=False,
        )
        assert child.returncode == 0, (
            f"run {run + 1} of {RUNS}: {_describe(child.returncode)}\n"
            f"{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
        )
