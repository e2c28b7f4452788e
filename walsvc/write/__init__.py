"""Layer 4, the write path: the coalescer that batches concurrent appends, the
serialization point that assigns ticks and hands envelopes to the backend, and ``Txn``.

Builds on ``walsvc.core``, ``walsvc.backends`` and ``scanners`` (the tail cache it fills);
independent of the read path. The modules here are private; ``walsvc.Txn`` is public.
"""

__all__: tuple[str, ...] = ()
