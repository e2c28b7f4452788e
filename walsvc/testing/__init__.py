"""Testing tools for walsvc users and backend authors.

- ``check_backend(open_wal_for)``: the conformance battery every backend must pass (the
  Milvus walimpls test framework, adapted); run it from your own test suite against a
  backend of your own.
- ``memory_wal()``: a private in-memory WAL for unit tests of code that uses walsvc.
"""

from ._conformance import check_backend
from ._memory import memory_wal

__all__ = ("check_backend", "memory_wal")
