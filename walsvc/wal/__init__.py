"""Layer 5, the WAL: ``WAL`` assembles a backend, the interceptor chain, the write path
and the read path; ``open_wal`` builds one from a URL; ``WALContext`` is what interceptors
see of it.

The only layer that imports ``interceptors`` (the default chain). The modules here are
private; ``walsvc.WAL`` and ``walsvc.open_wal`` are public.
"""

__all__: tuple[str, ...] = ()
