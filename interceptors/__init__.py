"""The append interceptors of walsvc, one module per interceptor, and the default chain.

An interceptor implements ``walsvc.Interceptor`` (``do_append(message, call_next)``) and
optionally ``walsvc.BatchInterceptor``, ``walsvc.ReadyInterceptor`` and
``walsvc.ClosingInterceptor``. Pass a chain to ``walsvc.open_wal(..., interceptors=[...])``
(outermost first); ``default_chain()`` builds the one ``open_wal`` uses by default.
"""

from __future__ import annotations

from ._dedup import DEFAULT_MAX_AGE, DEFAULT_MAX_KEYS, Dedup
from ._default import default_chain
from ._exclusive import ExclusiveLock
from ._redo import Redo
from ._timetick import DEFAULT_SYNC_INTERVAL, TimetickSync
from ._txn import Transactions

__all__ = (
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_KEYS",
    "DEFAULT_SYNC_INTERVAL",
    "Dedup",
    "ExclusiveLock",
    "Redo",
    "TimetickSync",
    "Transactions",
    "default_chain",
)
