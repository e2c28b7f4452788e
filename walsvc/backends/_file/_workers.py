"""The worker threads the file WALs of a process share: one pool of at most
``WORKER_THREADS``, made when first needed, so an idle pchannel costs no worker thread
of its own. Each writer has one batch or truncation in a thread at a time, so sharing
keeps every writer's order. A forked child never uses its parent's pool: the threads
stayed in the parent, and the child's writers get a pool of its own.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Final

__all__ = ("WORKER_THREADS", "worker_pool")

#: The worker threads the writers of a process share, at most.
WORKER_THREADS: Final = 8

_pool: ThreadPoolExecutor | None = None


def worker_pool() -> ThreadPoolExecutor:
    """The worker threads of this process's writers (made when first needed). Each
    writer has one batch or truncation in a thread at a time, so sharing keeps every
    writer's order."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="walsvc-file-writer")
    return _pool


def _forget_pool() -> None:
    """In a forked child: the pool's threads stayed in the parent, so the writers it
    opens itself get a pool of their own."""
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
