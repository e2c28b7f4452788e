"""Finding a frame in a segment without reading the segment: a binary search over byte
offsets that falls in step with the frames at each probe.

Frames lie end to end, and their first sequence numbers and timeticks grow with their
offsets, so the last frame before a target (a sequence number, a timetick) is found by
bisection: probe the middle of a byte range, take the first valid frame that starts at or
after it, keep the half the target lies in. A frame is recognised by its magic, a header
whose numbering fits between the frames already known on either side, and its CRC32C, so
bytes inside a payload are not taken for one. A range where no frame can be recognised
(damage) counts as lying after the target: the search then answers with an earlier
frame, which only costs the caller reading more.

Cost: about log2(segment size / ``NEAR``) probes, each reading a frame header, the frame
(most are a few KiB) and, past damage or inside a large frame, the bytes up to the next
magic. The caller walks the last ``NEAR`` bytes or so frame by frame, as any read does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from walsvc.core._codec import timetick_of
from walsvc.core._errors import CorruptRecord

from ._directory import LogDirectory
from ._format import FRAME_HEADER_SIZE, MAGIC, FrameHeader, parse_frame_header, verify_frame

__all__ = ("NEAR", "frame_at", "frame_from", "last_frame_where", "record_before_timetick")

#: A search stops once the answer is known to within this many bytes.
NEAR: Final = 256 * 1024
_CHUNK: Final = 64 * 1024
_NO_LIMIT: Final = 1 << 63

#: A frame, checked: its header and body.
Frame = tuple[FrameHeader, memoryview]


def frame_at(fd: int, offset: int, seq: int) -> Frame | None:
    """The frame at ``offset`` if it is valid and starts at record ``seq``; else None."""
    frame = _frame_at(fd, offset, seq, _NO_LIMIT, os.fstat(fd).st_size)
    return frame if frame is not None and frame[0].first_seq == seq else None


def last_frame_where(
    fd: int, start: Frame, stop: int, limit_seq: int, before: Callable[[Frame], bool]
) -> Frame:
    """The frame nearest (within ``NEAR`` bytes) before the first frame for which
    ``before`` is False, searching from ``start`` (a frame for which it is True) up to
    byte ``stop``; frames there number below ``limit_seq``. ``before`` must be True for a
    prefix of the frames and False after it (a sequence number or timetick below a target)."""
    low = start
    high, high_seq = stop, limit_seq
    size = os.fstat(fd).st_size
    while high - low[0].end > NEAR:
        middle = (low[0].end + high) // 2
        found = frame_from(fd, middle, high, low[0].end_seq, high_seq, size)
        if found is not None and before(found):
            low = found
        else:
            high = middle
            if found is not None:
                high_seq = found[0].first_seq
    return low


def record_before_timetick(directory: LogDirectory, timetick: int) -> int | None:
    """A record number from which reading includes every durable record with a tick at
    or above ``timetick`` (None: from the first retained record). Call from a worker
    thread: it reads the first frame of about log2(segments) segments, then probes one."""
    state = directory.head.read()
    segments = [s for s in directory.segments() if s < state.durable_end]
    low, high = 0, len(segments)  # the last segment starting below the tick, by bisection
    while low < high:
        middle = (low + high) // 2
        tick = _first_tick(directory, segments[middle])
        if tick is not None and tick < timetick:
            low = middle + 1
        else:  # at or past the tick, or unreadable: look earlier, which only reads more
            high = middle
    if low == 0:
        return None
    segment = segments[low - 1]
    try:
        fd = os.open(directory.segment_path(segment), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # truncated meanwhile
        return None
    try:
        start = frame_at(fd, 0, segment)
        if start is None:
            return max(segment, state.first_seq)
        stop = state.end_offset if segment == state.end_segment else os.fstat(fd).st_size
        found = last_frame_where(
            fd, start, stop, state.durable_end, lambda f: timetick_of(f[1]) < timetick
        )
    finally:
        os.close(fd)
    return max(found[0].first_seq, state.first_seq)


def _first_tick(directory: LogDirectory, segment: int) -> int | None:
    """The timetick of the first record of ``segment``, or None if it cannot be read."""
    try:
        fd = os.open(directory.segment_path(segment), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        frame = frame_at(fd, 0, segment)
    finally:
        os.close(fd)
    return None if frame is None else timetick_of(frame[1])


def frame_from(
    fd: int, start: int, stop: int, min_seq: int, limit_seq: int, size: int
) -> Frame | None:
    """The first valid frame that starts in ``[start, stop)`` and numbers its records
    from ``[min_seq, limit_seq)``; None if there is none."""
    position = start
    while position < stop:
        chunk = os.pread(fd, min(_CHUNK, stop - position) + len(MAGIC) - 1, position)
        at = chunk.find(MAGIC)
        while at != -1 and position + at < stop:
            frame = _frame_at(fd, position + at, min_seq, limit_seq, size)
            if frame is not None:
                return frame
            at = chunk.find(MAGIC, at + 1)
        if len(chunk) < len(MAGIC):
            return None
        position += _CHUNK
    return None


def _frame_at(fd: int, offset: int, min_seq: int, limit_seq: int, size: int) -> Frame | None:
    """The frame at ``offset`` if it is valid and numbers its records from
    ``[min_seq, limit_seq)``; else None."""
    data = os.pread(fd, FRAME_HEADER_SIZE, offset)
    if len(data) < FRAME_HEADER_SIZE:
        return None
    try:
        header = parse_frame_header(data, 0, offset)
    except CorruptRecord:
        return None
    if (
        not min_seq <= header.first_seq
        or header.first_seq + header.count > limit_seq
        or header.end > size
    ):
        return None
    body = memoryview(os.pread(fd, header.body_length, header.body_offset))
    try:
        verify_frame(header, body)
    except CorruptRecord:
        return None
    return header, body
