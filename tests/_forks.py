"""Reaping a forked test child: what the fork tests share."""

from __future__ import annotations

import os
import signal
import time

import pytest

__all__ = ("reap",)


def reap(pid: int, limit: float) -> None:
    """Wait up to ``limit`` seconds for the forked child ``pid``; fail the test if it
    hangs (it is killed) or exits with a status other than 0."""
    deadline = time.monotonic() + limit
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0
