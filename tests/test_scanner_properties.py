"""Properties of the read pipeline (tail cache, hand-offs, reorder and transaction
buffers, checkpoints, subscriptions) under random workloads (hypothesis; reproducible),
on ``memory://`` and ``file://``.

The property: for random, partly concurrent workloads of appends, batches, DDL and
transactions (committed, rolled back, expired, or left open across a restart: the next
writer rolls them back) over the vchannels "v1", "v2" and the broadcast "", with
restarts, every reader's output equals a reference model computed from the raw log
(tests/_scanner_model.py states it). The readers (tailing, opened mid-session, evicted
from a tiny or short-lived tail cache, subscriptions) are described with the workloads in
tests/_scanner_workload.py: at each session's end every reader must deliver exactly the
model's messages it is due, and over each test's run the hand-off, fallback, transaction
and idle-tick paths must all have been taken.

The property tests run hypothesis inside a plain test, on each event loop, so they
can check the whole run. The clock is injected and the timetick sync driven by hand:
nothing waits for a timer. The same property when appends fail is in
tests/test_scanner_fault_properties.py; the plain tests that reproduce what the property
found, and spell out the paths it must take, are in tests/test_scanner_paths.py.
"""

from __future__ import annotations

import collections
import uuid
from pathlib import Path
from typing import Any

import pytest
from _scanner_workload import LOOPS, SETTINGS, Run, check_over_the_run, run_on, workloads
from hypothesis import given, settings


@pytest.mark.slow
@pytest.mark.parametrize("loop", list(LOOPS))
def test_readers_deliver_the_model_on_memory(loop: str) -> None:
    tally: collections.Counter[str] = collections.Counter()

    @settings(SETTINGS, max_examples=100)
    @given(workload=workloads())
    def check(workload: dict[str, Any]) -> None:
        url = f"memory://{uuid.uuid4().hex}"
        run_on(loop, Run(url, workload, tally).run())

    check()
    check_over_the_run(tally)


@pytest.mark.slow
@pytest.mark.parametrize("loop", list(LOOPS))
def test_readers_deliver_the_model_on_file(loop: str, tmp_path: Path) -> None:
    tally: collections.Counter[str] = collections.Counter()

    @settings(SETTINGS, max_examples=40)
    @given(workload=workloads())
    def check(workload: dict[str, Any]) -> None:
        url = f"file://{tmp_path / uuid.uuid4().hex}"
        run_on(loop, Run(url, workload, tally).run())

    check()
    check_over_the_run(tally)
