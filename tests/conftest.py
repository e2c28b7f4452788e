"""Root test configuration: the event-loop matrix, no silent skips, seeded randomness.

- Every async test runs twice, on the stock asyncio loop and on uvloop.
- A skipped test fails the session: a test that cannot run (a broker that won't start, a
  missing extra) must say so loudly. Known deviations are strict ``xfail``s, not skips.
- An async test that runs past ``TEST_DEADLINE`` fails (it never hangs the run).
- Randomness comes from the ``seed`` fixture, which prints how to reproduce a failure.
- ``clock`` (an injected wall clock) and ``url`` (memory and file) serve the interceptor
  tests.
- ``node`` is a node process serving memory:// or file://, one per test module; a module
  that needs another kind of node (other options, a fresh one per test) defines its own.
  ``proxy`` is a TCP proxy in front of the module's ``node``, per test.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import uvloop  # Required in the test environment: without it the loop matrix is a lie.
from hypothesis import settings

if TYPE_CHECKING:
    from _chain_support import FakeClock
    from _tcp_proxy import TcpProxy

pytest_plugins = ("pytester",)

SEED_ENV = "WALSVC_TEST_SEED"

# "ci" (the default, what `make test` runs): seeded, so every run explores the same examples
# and a red run is reproducible. "explore": fresh random examples, more of them; run it
# locally to look for new failures, then pin what it finds with @example.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None, max_examples=100)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=20)
settings.register_profile(
    "explore", parent=settings.get_profile("ci"), derandomize=False, max_examples=300
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------------------------------
# Event loops


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Parametrize every async test (and its async fixtures) over both event loops."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


# ---------------------------------------------------------------------------------------
# No endless test

#: The longest an async test may run. A test that waits for ever (a race that lost a
#: wake-up, an answer that never comes) fails at its await with ``TimeoutError`` instead of
#: hanging the run: a clean-clone run once hung for good in such a test. The slowest test
#: takes well under a minute.
TEST_DEADLINE = 300.0


def _with_deadline(test: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        async with asyncio.timeout(TEST_DEADLINE):
            return await test(*args, **kwargs)

    return bounded


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run every async test under ``TEST_DEADLINE``; group the tests for ``make test``'s
    two workers (``_worker_group``)."""
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            item.obj = _with_deadline(item.obj)
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))


def _worker_group(item: pytest.Item) -> str:
    """The tests one worker of a parallel run (``pytest -n 2 --dist loadgroup``, as
    ``make test`` runs) takes together: the tests of a module, whose module-scoped
    fixtures (brokers, nodes) then start once; and every test on a SparkSession, so that
    one worker starts the session's JVM and runs the Spark jobs one after another."""
    if "spark" in getattr(item, "fixturenames", ()) or item.path.name.startswith("test_spark"):
        return "spark"
    return item.path.name


# ---------------------------------------------------------------------------------------
# No silent skips


class _SkipGuard:
    """Collects skips (at collection and at run time) and fails the session if any."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    def _record(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        # A strict xfail that fails as expected is reported as skipped with ``wasxfail``:
        # that is the expected outcome, not a skip.
        if report.skipped and not hasattr(report, "wasxfail"):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skipped.append((report.nodeid, reason))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # Module-level ``pytest.skip(allow_module_level=True)`` / ``importorskip``.
        self._record(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # Without skips, exit code 5 (no tests collected) is left as it is: also a failure.
        if not self.skipped:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "skipped tests fail this run (walsvc: no silent skips)")
            for nodeid, reason in self.skipped:
                reporter.write_line(f"SKIPPED {nodeid}: {reason}")
        # Worse outcomes (interrupted, internal or usage error) keep their own code.
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SkipGuard(), "walsvc-skip-guard")


# ---------------------------------------------------------------------------------------
# Seeded randomness

_SEED = pytest.StashKey[int]()
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()
"""Per-item stash key: the item's reports by phase ("setup", "call", "teardown")."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    item.stash.setdefault(REPORTS, {})[report.when] = report
    seed = item.stash.get(_SEED, None)
    if seed is not None and report.failed:
        report.sections.append(
            ("walsvc test seed", f"reproduce with: {SEED_ENV}={seed} pytest '{item.nodeid}'")
        )
    return report


@pytest.fixture
def seed_value(request: pytest.FixtureRequest) -> int:
    """The test's random seed: ``$WALSVC_TEST_SEED`` if set, else fresh from the OS."""
    raw = os.environ.get(SEED_ENV)
    if raw is None:
        value = random.SystemRandom().randrange(2**32)
    else:
        try:
            value = int(raw)
        except ValueError:
            pytest.fail(f"{SEED_ENV} must be an integer, got {raw!r}", pytrace=False)
    request.node.stash[_SEED] = value
    return value


@pytest.fixture
def seed(seed_value: int) -> random.Random:
    """A ``random.Random`` seeded with ``seed_value``; a failing test prints the seed."""
    return random.Random(seed_value)


@pytest.fixture
def clock() -> FakeClock:
    """Wall-clock milliseconds that move only when the test says so (``clock.ms += n``)."""
    from _chain_support import FakeClock  # here: the harness tests copy this file alone

    return FakeClock()


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh WAL location, once on ``memory://`` and once on ``file://``."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    return f"file://{tmp_path / 'log'}"


@pytest.fixture(scope="module", params=["memory", "file"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A node process serving a memory:// or a file:// log, shared by the tests of one
    module; yields its walsvc:// URL."""
    from _node_process import node_serving  # here: the harness tests copy this file alone

    with node_serving(request.param, tmp_path_factory.mktemp("node")) as url:
        yield url


@pytest.fixture
async def proxy(node: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A TCP proxy in front of ``node`` (the module's), and the walsvc:// URL through it."""
    from _tcp_proxy import proxied  # here: the harness tests copy this file alone

    async with proxied(node) as pair:
        yield pair
