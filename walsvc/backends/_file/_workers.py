"""The worker threads the file WALs of a process share: one pool of at most
``WORKER_THREADS``, made when first needed, so an idle pchannel costs no worker thread
of its own. Each writer has one batch or truncation in a thread at a time, so sharing
keeps every writer's order. A forked child never uses its parent's pool: the threads
stayed in the parent, and the child's writers get a pool of its own
(``ProcessThreads``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Final

from .._process_threads import ProcessThreads

__all__ = ("WORKER_THREADS", "worker_pool")

#: The worker threads the writers of a process share, at most.
WORKER_THREADS: Final = 8

_pool: Final = ProcessThreads(WORKER_THREADS, "walsvc-file-writer")


def worker_pool() -> ThreadPoolExecutor:
    """The worker threads of this process's writers (made when first needed). Each
    writer has one batch or truncation in a thread at a time, so sharing keeps every
    writer's order."""
    return _pool.executor()
