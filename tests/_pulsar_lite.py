"""A real Pulsar-protocol broker for the Pulsar tests: Pulsar Lite (the ``pulsar-lite`` wheel).

The launcher lives in ``walsvc.testing._pulsar_lite`` (benchmarks use it too); this module
holds the pytest side:

``pulsar_lite_broker(workdir)``: a started broker with its data in ``workdir``, stopped on
exit; the broker keeps its port and data directory across ``stop()``/``start()`` and
``restart()``, which the fault tests rely on.
A broker that cannot start FAILS the test with its stderr; it never skips.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from walsvc.testing import _pulsar_lite
from walsvc.testing._pulsar_lite import PulsarLite

__all__ = ("PulsarLite", "pulsar_lite_broker")


@contextlib.contextmanager
def pulsar_lite_broker(workdir: Path) -> Iterator[PulsarLite]:
    """A broker started in ``workdir`` (``pytest.fail`` with its stderr if it does not
    accept connections within 20 s), stopped by its pid on exit."""
    try:
        broker = _pulsar_lite.start_pulsar_lite(workdir)
    except _pulsar_lite.PulsarLiteStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()
