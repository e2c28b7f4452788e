"""The read pipeline's property (tests/test_scanner_properties.py: every reader delivers
the reference model of the raw log) when appends fail. On ``faultysub://``
(tests/_faulty.py's memory backend, with the memory backend's subscriptions) a workload's
"fault" op makes the next append fail: written but unacknowledged, not written, or
unavailable and retried. The first two reset the tail cache under the readers; over the
run the cache must have been reset at least once. Hypothesis inside a plain test, on each
event loop (see tests/test_scanner_properties.py)."""

from __future__ import annotations

import collections
import uuid
from typing import Any

import pytest
from _scanner_workload import (
    FAULTY,
    LOOPS,
    SETTINGS,
    FaultyBackend,
    Run,
    check_over_the_run,
    run_on,
    workloads,
)
from hypothesis import given, settings


@pytest.mark.slow
@pytest.mark.parametrize("loop", list(LOOPS))
def test_readers_deliver_the_model_when_appends_fail(loop: str) -> None:
    """Appends whose outcome is unknown reset the tail cache under the readers."""
    tally: collections.Counter[str] = collections.Counter()

    @settings(SETTINGS, max_examples=60)
    @given(workload=workloads(faults=True))
    def check(workload: dict[str, Any]) -> None:
        url = f"{FAULTY}://{uuid.uuid4().hex}"
        try:
            run_on(loop, Run(url, workload, tally).run())
        finally:
            FaultyBackend.faults.pop("p", None)

    check()
    check_over_the_run(tally)
    assert tally["cache resets"] >= 1, tally
