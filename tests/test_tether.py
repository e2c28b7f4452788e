"""Tethered programs (walsvc/testing/_tether.py) die with the process that started them,
however it dies, and leave nothing behind when they end on their own. Real processes:
a starter process is killed with SIGKILL, and /proc says who is still alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from walsvc.testing._tether import tethered

ROOT = Path(__file__).resolve().parent.parent

# A starter: starts `sleep <marker>` tethered (from a thread that then ends, when asked:
# PR_SET_PDEATHSIG alone would kill the program then; or from the main thread, then
# forks a child that lives on, when asked), prints the program's pid, then waits to be
# killed.
_STARTER = r"""
import os, subprocess, sys, threading, time
from walsvc.testing._tether import tethered
marker, from_thread = sys.argv[1], sys.argv[2] == "thread"
started = []
def start():
    command, fds = tethered(["sleep", marker])
    started.append(subprocess.Popen(command, pass_fds=fds))
if from_thread:
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
else:
    start()
if sys.argv[2] == "fork" and os.fork() == 0:  # a child that outlives its parent
    time.sleep(30)
    os._exit(0)
print(started[0].pid, flush=True)
time.sleep(600)
"""


def _alive_with(marker: str) -> list[int]:
    """The pids of live (not zombie) processes whose command line holds ``marker``: a
    program and its watcher, not a starter (or its forked child)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        starter = b"import tethered" in command
        if marker.encode() in command and state not in ("Z", "X") and not starter:
            pids.append(int(entry.name))
    return pids


def _wait_until_up(program: int, marker: str, within: float = 10.0) -> None:
    """Wait until ``program`` has become ``sleep`` (its ``execvp``, after it forked its
    watcher) and two processes hold ``marker``: the program and its watcher. On a loaded
    machine the bare interpreter before the ``execvp`` can take longer than any fixed
    sleep (seen: only the program alive 0.2 s after it started)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{program}/exe").resolve().name == "sleep":
                if len(_alive_with(marker)) >= 2:
                    return
        time.sleep(0.02)


def _wait_until_none_alive(marker: str, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while (alive := _alive_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def _marker() -> str:
    # A sleep of a unique length: the program's and its watcher's command lines hold it.
    return f"{1000 + uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 10**6:06d}"


@pytest.mark.parametrize("started_from", ["main thread", "thread", "main thread, then fork"])
@pytest.mark.parametrize("paused", [False, True], ids=["running", "paused"])
def test_a_tethered_program_dies_with_the_process_that_started_it(
    started_from: str, paused: bool
) -> None:
    marker = _marker()
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, marker, started_from.split()[-1]],
        start_new_session=True,  # its forked child too is killed at the end (killpg)
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    try:
        program = int(starter.stdout.readline())
        _wait_until_up(program, marker)
        time.sleep(0.2)  # the starter's thread, if any, has ended: the program lives on
        alive = _alive_with(marker)
        assert program in alive
        assert len(alive) == 2  # the program and its watcher
        if paused:
            os.kill(program, signal.SIGSTOP)
        starter.kill()  # no teardown, as a crashed pytest worker
        starter.wait()
        assert _wait_until_none_alive(marker) == []  # though a child of it lives
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(starter.pid, signal.SIGKILL)
        starter.wait()
        starter.stdout.close()
        for pid in _alive_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_tethered_program_is_the_started_process_and_takes_its_watcher_along() -> None:
    marker = _marker()
    command, fds = tethered(["sleep", marker])
    program = subprocess.Popen(command, pass_fds=fds)
    try:
        _wait_until_up(program.pid, marker)
        assert Path(f"/proc/{program.pid}/exe").resolve().name == "sleep"
        assert len(_alive_with(marker)) == 2
        program.terminate()  # signals reach the program itself
        assert program.wait(10) == -signal.SIGTERM
        assert _wait_until_none_alive(marker) == []  # the watcher went with it
    finally:
        program.kill()
        program.wait()


def test_a_program_that_cannot_start_fails_as_the_started_process() -> None:
    command, fds = tethered([f"no-such-program-{uuid.uuid4().hex}"])
    done = subprocess.run(command, pass_fds=fds, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "FileNotFoundError" in done.stderr
