"""Layer 4, the read path: a scanner's pipeline (source, reorder, transactions, ticks),
the log source that switches between the backend and the tail cache, and the writer of a
durable subscription's checkpoints.

Builds on ``walsvc.core``, ``walsvc.backends`` and ``scanners``; knows nothing of the WAL
that opens it. The modules here are private; ``walsvc.Scanner`` is public.
"""

__all__: tuple[str, ...] = ()
