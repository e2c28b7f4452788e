"""A pchannel's directory: its segment files, its sparse index, the in-process signal
that wakes tailing scanners when a writer in this process appends, and the one poll of
the head file that wakes them when another process appends."""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Final

from ..._errors import WALError
from ._format import segment_name, segment_seq
from ._head import HeadFile
from ._index import SparseIndex

__all__ = ("AppendSignal", "LogDirectory", "TailWatch", "fsync_directory")


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


class TailWatch:
    """Scanners of one ``LogDirectory`` waiting at the end of the log.

    A waiter is woken by the next append of a writer in this process (``AppendSignal``),
    or by the watch's poll of the head file once the durable end differs from the one
    the waiter saw. One poll per event loop serves every waiting scanner of the
    directory (one timer and one 61-byte read every ``poll_interval``, however many
    scanners wait), and it runs only while some scanner waits.
    """

    __slots__ = ("_head", "_polls", "_signal", "_waiters")

    def __init__(self, head: HeadFile, signal: AppendSignal) -> None:
        self._head = head
        self._signal = signal
        # waiter -> the durable end its scanner saw
        self._waiters: dict[asyncio.Future[None], int] = {}
        self._polls: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}

    def wait(self, durable_end: int, poll_interval: float) -> asyncio.Future[None]:
        """A future resolved once the log may have grown past ``durable_end``; give it
        back with ``discard`` once done with it."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters[waiter] = durable_end
        self._signal.add(waiter)
        if loop not in self._polls:
            self._polls[loop] = loop.call_later(poll_interval, self._poll, loop, poll_interval)
        return waiter

    def discard(self, waiter: asyncio.Future[None]) -> None:
        """Forget ``waiter`` (done or abandoned)."""
        self._waiters.pop(waiter, None)
        self._signal.discard(waiter)

    @property
    def waiting(self) -> int:
        """How many scanners wait."""
        return len(self._waiters)

    def _poll(self, loop: asyncio.AbstractEventLoop, poll_interval: float) -> None:
        del self._polls[loop]
        mine = [w for w in self._waiters if w.get_loop() is loop and not w.done()]
        if not mine:
            return
        try:
            end: int | None = self._head.read().durable_end
        except (OSError, WALError):
            end = None  # let the scanners read the head and report
        for waiter in mine:
            if end is None or end != self._waiters[waiter]:
                _set(waiter)
        if any(not w.done() for w in mine):
            self._polls[loop] = loop.call_later(poll_interval, self._poll, loop, poll_interval)


class LogDirectory:
    """Paths and shared per-process state of one pchannel directory."""

    __slots__ = ("head", "index", "path", "signal", "watch")

    def __init__(self, path: str, head: HeadFile) -> None:
        self.path = path
        self.head = head
        self.index = SparseIndex()
        signal = _signals.get(path)
        if signal is None:
            signal = _signals[path] = AppendSignal()
        self.signal = signal
        self.watch = TailWatch(head, signal)

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
