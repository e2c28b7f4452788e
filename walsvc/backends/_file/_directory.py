"""A pchannel's directory: its segment files, its sparse index, the in-process signal
that wakes tailing scanners when a writer in this process appends, and the one poll of
the head file that wakes them when another process appends."""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from typing import Any, Final, NamedTuple

from walsvc.core._errors import WALError

from ._format import segment_name, segment_seq
from ._frames import FrameBlock
from ._head import HeadFile, HeadState
from ._index import SparseIndex

__all__ = ("FRESH", "AppendSignal", "HeadView", "LogDirectory", "TailWatch", "fsync_directory")

#: Seconds a head read stays fresh for scanners that already used it, when no append in
#: this process was signalled since (see ``TailWatch.view``).
FRESH: Final = 0.005


class AppendSignal:
    """Futures of scanners waiting for appends to one pchannel directory, process-wide."""

    __slots__ = ("__weakref__", "_waiters", "generation")

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()
        #: Wakes so far: a head read before the last one may miss that append.
        self.generation = 0

    def add(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.add(waiter)

    def discard(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def wake(self) -> None:
        """Wake every waiter, on whichever event loop it belongs to (an append of this
        process reached the head file)."""
        self.generation += 1
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


class HeadView(NamedTuple):
    """A read of the head file and when it was made."""

    state: HeadState
    #: ``AppendSignal.generation`` before the read: a later one means an append of this
    #: process may be missing from ``state``.
    generation: int
    #: ``time.monotonic()`` before the read.
    at: float


class TailWatch:
    """Scanners of one ``LogDirectory`` waiting at the end of the log, and the head
    file as they see it.

    A waiter is woken by the next append of a writer in this process (``AppendSignal``),
    or by the watch's poll of the head file once the durable end differs from the one
    the waiter saw. One poll per event loop serves every waiting scanner of the
    directory (one timer and one 61-byte read every ``poll_interval``, however many
    scanners wait), and it runs only while some scanner waits.

    Scanners read the head through ``view``, which shares the newest read (the poll's, or
    another scanner's) instead of reading again: a scanner woken by the poll or by an
    append of this process reads nothing the poll or the first scanner woken read already,
    and a scanner that reached the durable end it knows waits instead of reading the head
    again, unless an append was signalled since or the read is older than ``FRESH``.
    Another process's appends are seen within ``poll_interval``, as before. A view is
    never ahead of the file, so a scanner that delivers below its durable end still
    delivers only durable records.

    The watch also keeps the newest block of durable frames a tailing scanner read on the
    loop (``block``/``keep_block``) and what scanners decoded of its frames (``decoded``):
    scanners woken by one append read its bytes and decode its records once, not once
    each (durable bytes never change, and messages are immutable, so they are shared).
    """

    __slots__ = (
        "_block",
        "_head",
        "_polls",
        "_signal",
        "_view",
        "_waiters",
        "decoded",
        "reads",
    )

    def __init__(self, head: HeadFile, signal: AppendSignal) -> None:
        self._head = head
        self._signal = signal
        # waiter -> the durable end its scanner saw
        self._waiters: dict[asyncio.Future[None], int] = {}
        self._polls: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}
        self._view: HeadView | None = None
        #: Reads of the head file made for scanners and the poll.
        self.reads = 0
        self._block: tuple[int, int, int, FrameBlock] | None = None
        #: What a scanner decoded of a frame of the kept block, for scanners that decode
        #: the same records with the same filter: (segment, frame offset, byte offset,
        #: first record, filter) -> ``FileScanner._decode``'s result.
        self.decoded: dict[tuple[Any, ...], tuple[list[Any], int, int, int]] = {}

    def block(self, segment: int, offset: int, size: int) -> FrameBlock | None:
        """The kept block if it is the ``size`` durable bytes at ``offset`` of ``segment``."""
        kept = self._block
        if kept is not None and kept[0] == segment and kept[1] == offset and kept[2] == size:
            return kept[3]
        return None

    def keep_block(self, segment: int, offset: int, size: int, block: FrameBlock) -> None:
        """Keep ``block``, the ``size`` durable bytes at ``offset`` of ``segment`` (frames
        below the durable end: they never change), instead of the one kept before."""
        self._block = (segment, offset, size, block)
        self.decoded = {}

    def read(self) -> HeadView:
        """Read the head file now, and share what it says."""
        generation, at = self._signal.generation, time.monotonic()
        self.reads += 1
        view = HeadView(self._head.read(), generation, at)
        shared = self._view
        if shared is None or shared.at <= at:
            self._view = view
        return view

    def view(self, used: HeadView | None) -> HeadView:
        """The head as a scanner that last used ``used`` should see it now: the shared
        read when it is newer than ``used`` or younger than ``FRESH``, and no append of
        this process was signalled since it was made; else a new read."""
        shared = self._view
        if (
            shared is not None
            and shared.generation == self._signal.generation
            and ((used is not None and shared is not used) or time.monotonic() - shared.at < FRESH)
        ):
            return shared
        return self.read()

    def wait(
        self, durable_end: int, poll_interval: float, generation: int | None = None
    ) -> asyncio.Future[None]:
        """A future resolved once the log may have grown past ``durable_end`` (at once if
        an append was signalled since ``generation``); give it back with ``discard`` once
        done with it."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if generation is not None and generation != self._signal.generation:
            waiter.set_result(None)
            return waiter
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
            end: int | None = self.read().state.durable_end
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
