"""Scanners of the local log: walk segments frame by frame from a start position, deliver
only records below the head file's durable end, and wait for appends at the end."""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from walsvc.backends._base import BackendScanner, EnvelopeRun
from walsvc.core._budget import STEP, turn
from walsvc.core._errors import BackendUnavailable, CorruptRecord, WALClosed, WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage
from walsvc.core._runs import decode_chunk, offset_after

from ._directory import HeadView
from ._format import FrameHeader
from ._frames import BLOCK_SIZE, FrameBlock, read_frames
from ._head import HeadState
from ._ids import FileMessageId
from ._seek import NEAR, frame_at, frame_from, last_frame_where

if TYPE_CHECKING:
    from ._backend import FileBackend

__all__ = ("INLINE_READ", "FileRunScanner", "FileScanner")

#: A read of at most this many bytes (a tailing scanner's: what is new below the
#: durable end) is made on the event loop: the bytes were just written, so they are in
#: the page cache, and a worker thread's round trip costs more than the copy.
INLINE_READ: Final = 64 * 1024


class FileScanner(BackendScanner):
    """Messages of one file log from a start sequence number, in log order.

    A block read from a segment is decoded a step at a time (``_budget.STEP`` records at
    most), each step after ``_budget.turn()``: a scanner catching up never holds the
    event loop for a whole block. At the end of the log a read asks only for the bytes
    below the head's durable end, and small reads (a tailing scanner's) are made on the
    loop instead of in a worker thread.
    """

    __slots__ = (
        "_at",
        "_backend",
        "_block_end",
        "_busy",
        "_closed",
        "_deliver_from",
        "_fd",
        "_frame",
        "_frames",
        "_offset",
        "_offset_seq",
        "_segment",
        "_selected",
        "_shared",
        "_view",
        "_waiter",
    )

    reports_position = True
    #: Whether decoded records are shared with the directory's other scanners.
    _share_decoded: ClassVar[bool] = True

    def __init__(self, backend: FileBackend, deliver_from: int, selected: Filter) -> None:
        self._backend = backend
        self._deliver_from = deliver_from
        self._selected = selected
        self._closed = False
        self._busy = False  # a block read is running in a worker thread
        self._fd: int | None = None
        self._segment = 0
        self._offset = 0
        self._offset_seq = 0  # sequence number of the record at _offset
        self._waiter: asyncio.Future[None] | None = None
        self._view: HeadView | None = None  # the head as last seen (TailWatch.view)
        self._shared = False  # _frames are the TailWatch's kept block's
        # The durable frames of the last block read that are not consumed yet, from
        # _frames[_frame]; _at is the byte offset in that frame's body of record
        # _deliver_from when a step stopped inside it, else -1.
        self._frames: list[tuple[FrameHeader, memoryview]] = []
        self._frame = 0
        self._at = -1
        # Why the last block ended (stop, error, durable end), acted on once its frames
        # are consumed; None if it was cut at a frame not yet durable.
        self._block_end: tuple[str, CorruptRecord | None, int] | None = None

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        return await self._next_items()

    async def _next_items(self) -> list[Any]:
        """``_walk`` with the operating system's errors translated at the boundary."""
        try:
            return await self._walk()
        except OSError as exc:
            path = self._backend.directory.segment_path(self._segment)
            raise BackendUnavailable(f"cannot read {path}: {exc}") from exc

    def _decode(
        self, body: memoryview, first_seq: int, at: int, units: int, end_seq: int
    ) -> tuple[list[Any], int, int, int]:
        """The items the records of a frame's body (whose last record is ``end_seq - 1``)
        from byte ``at`` (record ``first_seq``) make while ``units`` last
        (``_runs.decode_chunk``): the messages the filter admits, the byte offset and
        record after the last one examined, and the units spent."""
        return decode_chunk(body, first_seq, FileMessageId, self._selected, at, len(body), units)

    async def _walk(self) -> list[Any]:
        """What ``_decode`` makes of the next records at or after ``_deliver_from``, a
        step at a time, waiting for them at the end of the log."""
        directory = self._backend.directory
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise WALClosed("scanner is closed")
            if self._frame < len(self._frames):
                out = await self._step()
                if out:
                    return out
                continue
            ended, self._block_end = self._block_end, None
            if ended is not None:
                stop, error, durable_end = ended
                if stop in ("bad", "partial") and await self._skip_damage(loop):
                    continue
                self._after_block(stop, error, durable_end)
                continue
            if self._fd is None:
                self._position(directory.head.read().first_seq)
                await self._seek(loop)
                continue  # closed meanwhile? the head moved on?
            # The head as the watch last read it, unless it may be behind (see
            # TailWatch.view): one read serves every scanner of the directory.
            view = self._view = directory.watch.view(self._view)
            state = view.state
            if self._offset_seq >= state.durable_end or (self._deliver_from >= state.durable_end):
                await self._wait(state.durable_end, view.generation)
                continue
            block = await self._read_block(loop, state)
            if self._closed:
                raise WALClosed("scanner is closed")
            frames = block.frames
            cut = False
            for i, (header, _) in enumerate(frames):
                if header.first_seq >= state.durable_end:
                    frames, cut = frames[:i], True  # written but not yet durable
                    break
            self._frames, self._frame, self._at = frames, 0, -1
            if not cut:
                self._block_end = (block.stop, block.error, state.durable_end)

    async def _read_block(self, loop: asyncio.AbstractEventLoop, state: HeadState) -> FrameBlock:
        """The frames from ``_offset``: no further than the durable end when it lies in
        this segment, read on the loop when that is at most ``INLINE_READ`` bytes."""
        fd = self._fd
        assert fd is not None
        size = BLOCK_SIZE
        if state.end_segment == self._segment and state.end_offset > self._offset:
            size = min(size, state.end_offset - self._offset)
            if size <= INLINE_READ:
                # Durable bytes a tailing scanner reads: one read (and one decode, see
                # _step) serves every scanner of the directory that reads them.
                watch = self._backend.directory.watch
                block = watch.block(self._segment, self._offset, size)
                if block is None:
                    block = read_frames(fd, self._offset, size)
                    watch.keep_block(self._segment, self._offset, size, block)
                self._shared = True
                return block
        self._shared = False
        self._busy = True
        try:
            return await loop.run_in_executor(None, read_frames, fd, self._offset, size)
        finally:
            self._busy = False
            if self._closed:
                self._close_fd()

    async def _step(self) -> list[Any]:
        """Decode up to ``STEP`` units of the pending frames, once the loop's iteration
        has budget for them."""
        budget = await turn()
        if self._closed:
            raise WALClosed("scanner is closed")
        directory = self._backend.directory
        frames = self._frames
        left = STEP
        out: list[Any] = []
        while left > 0 and self._frame < len(frames):
            header, body = frames[self._frame]
            at = self._at
            if at < 0:  # a new frame
                if header.first_seq != self._offset_seq:
                    raise CorruptRecord(
                        f"{directory.segment_path(self._segment)}: frame at offset"
                        f" {header.offset} starts at record {header.first_seq},"
                        f" expected {self._offset_seq}"
                    )
                skip = self._deliver_from - header.first_seq
                at = 0
                if skip >= header.count:
                    at = len(body)  # every record was delivered before, or is not asked for
                elif skip > 0:
                    at = offset_after(body, skip)
                else:
                    self._deliver_from = header.first_seq
            if at < len(body):
                got, at, seq, spent = self._decode_frame(header, body, at, left)
                out += got
                left -= spent
                self._deliver_from = seq
            if at >= len(body):  # the frame is done
                self._deliver_from = max(self._deliver_from, header.end_seq)
                directory.index.note(self._segment, header.first_seq, header.offset)
                self._offset = header.end
                self._offset_seq = header.end_seq
                self._frame += 1
                at = -1
            self._at = at
        budget.spend(STEP - left)
        if self._frame >= len(frames):
            self._frames, self._frame = [], 0  # let the block go
        return out

    def _decode_frame(
        self, header: FrameHeader, body: memoryview, at: int, units: int
    ) -> tuple[list[Any], int, int, int]:
        """``_decode`` from byte ``at`` of the frame, or what another scanner of the
        directory decoded there with the same filter (frames of the shared block)."""
        if not (self._shared and self._share_decoded):
            return self._decode(body, self._deliver_from, at, units, header.end_seq)
        decoded = self._backend.directory.watch.decoded
        key = (self._segment, header.offset, at, self._deliver_from, self._selected)
        found = decoded.get(key)
        if found is not None and found[3] <= units:
            return found
        found = self._decode(body, self._deliver_from, at, units, header.end_seq)
        decoded[key] = found
        return found

    async def _skip_damage(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The frame at ``_offset`` is bad. If it lies before ``_deliver_from`` (records
        this scanner is not asked for), go on from the next valid frame if that one starts
        at or before ``_deliver_from``: damage a read does not cross does not fail it.
        True if it does."""
        if self._offset_seq >= self._deliver_from:
            return False
        fd = self._fd
        assert fd is not None
        self._busy = True
        try:
            size = os.fstat(fd).st_size
            found = await loop.run_in_executor(
                None,
                frame_from,
                fd,
                self._offset + 1,
                size,
                self._offset_seq + 1,
                1 << 63,
                size,
            )
        finally:
            self._busy = False
            if self._closed:
                self._close_fd()
        if found is None or self._closed or found[0].first_seq > self._deliver_from:
            return False  # records this scanner is asked for are in the damage
        self._offset, self._offset_seq = found[0].offset, found[0].first_seq
        return True

    def _after_block(self, stop: str, error: CorruptRecord | None, durable_end: int) -> None:
        """Act on why a block ended when all its frames were consumed."""
        if stop == "block" or self._offset_seq >= durable_end:
            return
        path = self._backend.directory.segment_path(self._segment)
        if stop == "eof":
            self._next_segment()
        elif stop == "bad":
            raise CorruptRecord(f"{path}: {error}")
        else:  # partial, below the durable end
            raise CorruptRecord(f"{path}: record {self._offset_seq} is durable but incomplete")

    def _position(self, first_retained: int) -> None:
        """Open the segment holding ``_deliver_from`` at the nearest indexed frame.

        Whether a missing position was truncated is the head file's call (truncation
        records the new start before deleting segments); anything else missing is
        corruption.
        """
        directory = self._backend.directory
        target = self._deliver_from
        for _ in range(3):  # a concurrent truncation may delete the segment picked
            if target < first_retained:
                raise WALTruncated(
                    f"file WAL {directory.path}: record {target} was truncated; the log now"
                    f" starts at {first_retained}"
                )
            segments = directory.segments()
            i = bisect.bisect_right(segments, target) - 1
            if i >= 0:
                try:
                    self._open_segment(segments[i])
                except FileNotFoundError:
                    pass
                else:
                    self._offset_seq, self._offset = directory.index.floor(segments[i], target)
                    return
            state = directory.head.read()
            if state.first_seq == first_retained:
                raise CorruptRecord(
                    f"file WAL {directory.path}: no segment holds record {target}, which was"
                    f" never truncated (the log starts at {first_retained})"
                )
            first_retained = state.first_seq
        raise WALTruncated(f"file WAL {directory.path}: record {target} is being truncated")

    async def _seek(self, loop: asyncio.AbstractEventLoop) -> None:
        """From the indexed frame ``_position`` found, get to within ``NEAR`` bytes of
        ``_deliver_from`` by a binary search over the segment (a log reopened knows few
        frames of its segments), in a worker thread."""
        fd = self._fd
        assert fd is not None
        if os.fstat(fd).st_size - self._offset <= NEAR:
            return
        self._busy = True
        try:
            found = await loop.run_in_executor(
                None, _seek_record, fd, self._offset, self._offset_seq, self._deliver_from
            )
        finally:
            self._busy = False
            if self._closed:
                self._close_fd()
        if found is not None:
            self._offset_seq, self._offset = found
            self._backend.directory.index.note(self._segment, *found)

    def _next_segment(self) -> None:
        """The current segment is exhausted and the log goes on: open the next one, which
        must start exactly where this one ended."""
        directory = self._backend.directory
        later = [s for s in directory.segments() if s > self._segment]
        if not later or later[0] != self._offset_seq:
            if directory.head.read().first_seq > self._offset_seq:
                raise WALTruncated(
                    f"file WAL {directory.path}: records from {self._offset_seq} were"
                    " truncated while this scanner was behind"
                )
            raise CorruptRecord(
                f"file WAL {directory.path}: segment {self._segment} ends at record"
                f" {self._offset_seq}, but the next segment starts at"
                f" {later[0] if later else 'no record'}"
            )
        try:
            self._open_segment(later[0])
        except FileNotFoundError:
            raise WALTruncated(
                f"file WAL {directory.path}: the segment starting at record"
                f" {self._offset_seq} was truncated while this scanner was behind"
            ) from None
        self._offset = 0

    def _open_segment(self, segment: int) -> None:
        path = self._backend.directory.segment_path(segment)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._segment = fd, segment

    async def _wait(self, durable_end: int, generation: int) -> None:
        """Wait for the durable end to move past ``durable_end`` (as read at append
        signal ``generation``): an append in this process wakes at once, another
        process's is seen by the directory's shared poll of the head file (every
        ``poll_interval``)."""
        watch = self._backend.directory.watch
        waiter = watch.wait(durable_end, self._backend.poll_interval, generation)
        self._waiter = waiter
        try:
            await waiter
        finally:
            watch.discard(waiter)
            self._waiter = None

    def position(self) -> MessageId | None:
        seq = self._deliver_from  # every record below it was returned or rejected
        return FileMessageId(seq - 1) if seq else None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.forget_scanner(self)
        waiter = self._waiter
        if waiter is not None:
            _set(waiter)
        if not self._busy:  # else the reading task closes it when the read returns
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FileRunScanner(FileScanner):
    """The records of a file log from a start sequence number as runs of raw envelopes
    (no filter, nothing decoded): for readers that decode headers column-wise."""

    __slots__ = ()
    _share_decoded = False

    async def next_runs(self) -> list[EnvelopeRun]:
        """The next one or more runs, in log order, waiting until there is one."""
        return await self._next_items()

    def _decode(
        self, body: memoryview, first_seq: int, at: int, units: int, end_seq: int
    ) -> tuple[list[Any], int, int, int]:
        # Nothing is decoded here: the rest of the frame is one step, one unit a record.
        return [EnvelopeRun(first_seq, body, at)], len(body), end_seq, end_seq - first_seq


def _seek_record(fd: int, offset: int, seq: int, target: int) -> tuple[int, int] | None:
    """(first record, offset) of a frame within ``NEAR`` bytes before the one holding
    record ``target``, searched from the frame at ``offset`` (which starts at record
    ``seq``); None if that frame cannot be read (the walk from it reports why)."""
    start = frame_at(fd, offset, seq)
    if start is None:
        return None
    size = os.fstat(fd).st_size
    header, _ = last_frame_where(fd, start, size, 1 << 63, lambda f: f[0].first_seq <= target)
    return header.first_seq, header.offset


def _set(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
