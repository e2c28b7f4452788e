"""A pchannel's directory: its segment files, its sparse index, and the in-process signal
that wakes tailing scanners when a writer in this process appends."""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Final

from ._format import segment_name, segment_seq
from ._head import HeadFile
from ._index import SparseIndex

__all__ = ("AppendSignal", "LogDirectory", "fsync_directory")


class AppendSignal:
    """Futures of scanners waiting for appends to one pchannel directory, process-wide."""

    __slots__ = ("__weakref__", "_waiters")

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def add(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.add(waiter)

    def discard(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def wake(self) -> None:
        """Wake every waiter, on whichever event loop it belongs to."""
        waiters, self._waiters = self._waiters, set()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for waiter in waiters:
            loop = waiter.get_loop()
            if loop is running:
                _set(waiter)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(_set, waiter)


def _set(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_signals: Final[weakref.WeakValueDictionary[str, AppendSignal]] = weakref.WeakValueDictionary()


class LogDirectory:
    """Paths and shared per-process state of one pchannel directory."""

    __slots__ = ("head", "index", "path", "signal")

    def __init__(self, path: str, head: HeadFile) -> None:
        self.path = path
        self.head = head
        self.index = SparseIndex()
        signal = _signals.get(path)
        if signal is None:
            signal = _signals[path] = AppendSignal()
        self.signal = signal

    def segments(self) -> list[int]:
        """First sequence numbers of the segment files present, ascending."""
        found = (segment_seq(name) for name in os.listdir(self.path))
        return sorted(seq for seq in found if seq is not None)

    def segment_path(self, first_seq: int) -> str:
        return os.path.join(self.path, segment_name(first_seq))


def fsync_directory(path: str) -> None:
    """Make created or deleted directory entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
