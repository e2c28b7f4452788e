"""Append interceptors (timetick, transactions, dedup, exclusive DDL, redo).

Not built yet: issue 3. Today the WAL assigns timeticks itself at the serialization point
(see ``walsvc._wal``); the interceptor chain will wrap that step.
"""

__all__ = ()
