"""The file operations of a pchannel's writer: append a batch (rolling to a new segment,
keeping the runway), cut the log back to the head's durable end, truncate. Each one
blocks, runs in a worker thread and holds the writers' lock (the head file's ``flock``)
after re-reading the head's term: if a newer writer opened the pchannel, it writes
nothing and raises ``WALFenced``. ``_writer.GroupCommitWriter`` decides which thread runs
what, and when; the commit thread (``_ccommit``) appends a batch itself, under the same
lock and check, when ``SegmentWriter._committable`` says it needs neither a new segment
nor more runway.

With ``sync="always"`` the writer keeps a zero-filled runway ahead of its write offset
(up to ``RUNWAY`` bytes, never past ``segment_size``). Overwriting blocks the file already
has lets ``fdatasync`` flush data only; appending past the end of the file would also
commit the new size and extents to the journal, which doubles its cost here. The batch
that reaches the end of the runway extends it (PostgreSQL zero-fills WAL segments for
the same reason). A segment is cut to its last frame before the writer rolls to the next,
so only the newest segment ever ends in zeros.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Final

from walsvc.core._errors import WALFenced

from ._directory import LogDirectory, fsync_directory
from ._head import HeadState
from ._recovery import Tail, cut_to_durable_end
from ._writer_note import read_writer_note

__all__ = ("RUNWAY", "SegmentWriter")

#: Bytes of zeros the writer keeps ahead of its offset (``sync="always"`` only). Writing
#: and syncing 1 MiB of zeros takes ~1.5 ms here (4 MiB: ~11 ms, a visible ack stall).
RUNWAY: Final = 1 << 20
_ZEROS: Final = bytes(RUNWAY)


class SegmentWriter:
    """The file operations of the single writer of one pchannel directory (for one
    term); ``GroupCommitWriter`` builds the writer on them."""

    __slots__ = (
        "_directory",
        "_fd",
        "_offset",
        "_segment",
        "_segment_size",
        "_sync",
        "_term",
        "_zeroed_to",
    )

    def __init__(
        self, directory: LogDirectory, term: int, tail: Tail, *, sync: bool, segment_size: int
    ) -> None:
        self._directory = directory
        self._term = term
        self._segment = tail.segment
        self._fd = tail.fd
        self._offset = tail.offset
        self._zeroed_to = tail.size  # the segment file's size: zeros from _offset to here
        self._sync = sync
        self._segment_size = segment_size

    def _committable(self, size: int) -> bool:
        """True if a batch of ``size`` bytes needs no new segment and, with ``sync``,
        fits in the runway: the commit thread does neither."""
        return self._offset < self._segment_size and (
            not self._sync or self._offset + size <= self._zeroed_to
        )

    def _fenced(self, term: int) -> WALFenced:
        """The error of a writer fenced by a newer one with ``term`` (named if its note
        says who)."""
        who = read_writer_note(self._directory.path, term)
        by = "" if who is None else f" ({who})"
        return WALFenced(
            f"file WAL {self._directory.path}: term {self._term} was fenced by a"
            f" writer with term {term}{by}: another read-write open of this pchannel;"
            " readers open with read_only=True, which fences nothing"
        )

    @contextlib.contextmanager
    def _writers_lock(self) -> Iterator[HeadState]:
        """Worker thread: hold the writers' lock and yield the head's state; raise
        ``WALFenced`` (the lock released) if a newer term fenced this writer."""
        head = self._directory.head
        head.lock()
        try:
            state = head.read()
            if state.term != self._term:
                raise self._fenced(state.term)
            yield state
        finally:
            head.unlock()

    def _cut_to_durable_end(self) -> Tail:
        """Worker thread, under the writers' lock: the tail after ``cut_to_durable_end``,
        unless a newer term fenced this writer."""
        with self._writers_lock() as state:
            return cut_to_durable_end(self._directory, state)

    def _write(self, data: bytes, first: int, count: int, last_timetick: int) -> None:
        """Worker thread: append one batch under the writers' lock."""
        with self._writers_lock() as state:
            if self._offset >= self._segment_size:
                self._roll(first)
            offset = self._offset
            _write_all(self._fd, data, offset)
            offset += len(data)
            if self._sync and offset > self._zeroed_to:
                self._extend_runway(offset)
            if self._sync:
                os.fdatasync(self._fd)
            self._offset = offset
            self._directory.head.write(
                HeadState(
                    self._term, first + count, state.first_seq, last_timetick, self._segment, offset
                ),
                sync=False,
            )

    def _extend_runway(self, end: int) -> None:
        """Worker thread: zero-fill from ``end`` (the end of the data just written, past
        the old runway) up to ``RUNWAY`` further, but not past ``segment_size``. The
        batch's own ``fdatasync`` makes the zeros durable."""
        target = min(end + RUNWAY, self._segment_size)
        if target > end:
            _write_all(self._fd, memoryview(_ZEROS)[: target - end], end)
        self._zeroed_to = max(end, target)

    def _roll(self, first: int) -> None:
        """Worker thread, under the lock: start a new segment at record ``first``, after
        cutting the old one to its last frame (a runway left there by a larger
        ``segment_size`` of an earlier open)."""
        if self._zeroed_to > self._offset:
            # Durable before the next segment exists: readers take the end of a
            # segment followed by another one as the end of its frames.
            os.ftruncate(self._fd, self._offset)
            os.fdatasync(self._fd)
        elif not self._sync:
            os.fdatasync(self._fd)
        path = self._directory.segment_path(first)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fsync_directory(self._directory.path)
        os.close(self._fd)
        self._fd, self._segment, self._offset, self._zeroed_to = fd, first, 0, 0

    def _truncate(self, seq: int) -> list[int]:
        """Worker thread, under the writers' lock: record ``seq + 1`` as the first record
        (durably), then delete the segments that hold nothing newer; their numbers."""
        with self._writers_lock() as state:
            if seq < state.first_seq:
                return []
            self._directory.head.write(state._replace(first_seq=seq + 1), sync=True)
            segments = self._directory.segments()
            doomed = [s for s, after in itertools.pairwise(segments) if after <= seq + 1]
            for segment in doomed:
                os.unlink(self._directory.segment_path(segment))
            if doomed:
                fsync_directory(self._directory.path)
            return doomed


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (a short write continues)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
