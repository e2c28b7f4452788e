"""The test harness itself: loop matrix, no silent skips, seeds printed on failure."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

from walsvc.testing import start_tansu
from walsvc.testing._tansu import wait_stopped

_INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
xfail_strict = true
filterwarnings = error
"""


@pytest.fixture
def harness(pytester: pytest.Pytester) -> pytest.Pytester:
    """A scratch project using this directory's conftest.py and the strict settings."""
    pytester.makeini(_INI)
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    return pytester


async def test_runs_on_the_parametrized_loop(request: pytest.FixtureRequest) -> None:
    factories = {asyncio.new_event_loop: asyncio.BaseEventLoop, uvloop.new_event_loop: uvloop.Loop}
    [factory] = [p for p in request.node.callspec.params.values() if p in factories]
    loop = asyncio.get_running_loop()
    assert isinstance(loop, factories[factory])
    assert isinstance(loop, uvloop.Loop) == (factory is uvloop.new_event_loop)


def test_seed_is_a_seeded_random(seed: random.Random, seed_value: int) -> None:
    assert type(seed) is random.Random
    assert seed.getstate() == random.Random(seed_value).getstate()


def test_every_async_test_runs_on_both_loops(harness: pytest.Pytester) -> None:
    harness.makepyfile("async def test_a():\n    pass\n")
    result = harness.runpytest_subprocess("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_a?asyncio? PASSED*", "*test_a?uvloop? PASSED*"])


@pytest.mark.parametrize(
    "source",
    [
        "import pytest\n\ndef test_ok():\n    pass\n\n"
        "def test_s():\n    pytest.skip('no broker')\n",
        "import pytest\n\npytest.importorskip('no_such_module_walsvc')\n\n"
        "def test_ok():\n    pass\n",
    ],
    ids=["in-test", "module-level"],
)
def test_a_skip_fails_the_session(harness: pytest.Pytester, source: str) -> None:
    harness.makepyfile(source)
    result = harness.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*no silent skips*", "SKIPPED *"])


def test_a_strict_xfail_is_not_a_skip(harness: pytest.Pytester) -> None:
    harness.makepyfile(
        "import pytest\n\n@pytest.mark.xfail(reason='known deviation')\ndef test_x():\n"
        "    raise AssertionError\n"
    )
    result = harness.runpytest_subprocess()
    result.assert_outcomes(xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_no_tests_is_a_failure(harness: pytest.Pytester) -> None:
    assert harness.runpytest_subprocess().ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_a_failure_prints_its_seed(
    harness: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WALSVC_TEST_SEED", "1234")
    harness.makepyfile(
        "def test_ok(seed):\n    pass\n\ndef test_bad(seed):\n    assert seed.random() < 0\n"
    )
    result = harness.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*walsvc test seed*", "*WALSVC_TEST_SEED=1234 pytest *test_bad*"])
    assert result.stdout.str().count("WALSVC_TEST_SEED=1234") == 1


# ---------------------------------------------------------------------------------------
# Broker launchers: a pause either stops every thread of the broker or fails


def test_wait_stopped_returns_only_once_every_thread_is_stopped() -> None:
    """Before: ``wait_stopped`` gave up silently after its deadline (and returned at once
    for a process that was gone), so a pause that did not take looked like a broker
    answering while paused ("DID NOT RAISE BackendUnavailable")."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match=rf"process {child.pid} did not stop"):
            wait_stopped(child.pid, within=0.2)  # running: never signalled
        os.kill(child.pid, signal.SIGSTOP)
        wait_stopped(child.pid)
        os.kill(child.pid, signal.SIGCONT)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(RuntimeError, match="is not running"):
        wait_stopped(child.pid)


def test_a_broker_that_exited_cannot_be_paused() -> None:
    broker = start_tansu()
    broker.pause()
    broker.resume()
    broker.stop()
    with pytest.raises(RuntimeError, match="exited"):
        broker.pause()
