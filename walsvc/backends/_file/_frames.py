"""Reading frames from a segment file in large blocks, checking each frame's CRC.

Both the writer's recovery and the scanners use ``read_frames``; they differ only in what
they make of a frame that is not whole or not valid (see ``FrameBlock.stop``).
"""

from __future__ import annotations

import os
from typing import Final, Literal

from walsvc.core._errors import CorruptRecord

from ._format import FRAME_HEADER_SIZE, FrameHeader, parse_frame_header, verify_frame

__all__ = ("BLOCK_SIZE", "FrameBlock", "read_frames")

#: How much one read asks for (frames larger than this are read whole).
BLOCK_SIZE: Final = 1 << 20

Stop = Literal["block", "eof", "partial", "bad"]


class FrameBlock:
    """Whole, valid frames read from one offset, and why reading stopped.

    ``stop`` is ``"block"`` (the block ended; read on from ``next_offset``), ``"eof"``
    (nothing follows ``next_offset``), ``"partial"`` (bytes at ``next_offset`` are not a
    whole frame yet) or ``"bad"`` (the frame at ``next_offset`` fails its checks:
    ``error`` says how; ``bad_end`` is where that frame claims to end, or None).
    """

    __slots__ = ("bad_end", "error", "frames", "next_offset", "stop")

    def __init__(
        self,
        frames: list[tuple[FrameHeader, memoryview]],
        next_offset: int,
        stop: Stop,
        error: CorruptRecord | None = None,
        bad_end: int | None = None,
    ) -> None:
        self.frames = frames
        self.next_offset = next_offset
        self.stop: Stop = stop
        self.error = error
        self.bad_end = bad_end


def read_frames(fd: int, offset: int, block_size: int = BLOCK_SIZE) -> FrameBlock:
    """Read the frames starting at ``offset`` of the segment open on ``fd``."""
    data = os.pread(fd, block_size, offset)
    view = memoryview(data)
    frames: list[tuple[FrameHeader, memoryview]] = []
    at = 0
    while True:
        available = len(view) - at
        if available == 0:
            stop: Stop = "eof" if len(data) < block_size else "block"
            return FrameBlock(frames, offset + at, stop)
        if available < FRAME_HEADER_SIZE:
            if len(data) < block_size:
                return FrameBlock(frames, offset + at, "partial")
            return FrameBlock(frames, offset + at, "block")
        try:
            header = parse_frame_header(view, at, offset + at)
        except CorruptRecord as exc:
            return FrameBlock(frames, offset + at, "bad", exc)
        if header.body_length > available - FRAME_HEADER_SIZE:
            if len(data) < block_size:
                return FrameBlock(frames, offset + at, "partial", bad_end=header.end)
            if frames:
                return FrameBlock(frames, offset + at, "block")
            return _read_one_large_frame(fd, header)
        body = view[at + FRAME_HEADER_SIZE : at + FRAME_HEADER_SIZE + header.body_length]
        try:
            verify_frame(header, body)
        except CorruptRecord as exc:
            return FrameBlock(frames, offset + at, "bad", exc, bad_end=header.end)
        frames.append((header, body))
        at += FRAME_HEADER_SIZE + header.body_length


def _read_one_large_frame(fd: int, header: FrameHeader) -> FrameBlock:
    """Read a frame larger than a block on its own. A length that runs past the end of
    the file (a torn write, or a damaged length) is never allocated."""
    size = FRAME_HEADER_SIZE + header.body_length
    if header.end > os.fstat(fd).st_size:
        return FrameBlock([], header.offset, "partial", bad_end=header.end)
    view = memoryview(os.pread(fd, size, header.offset))
    if len(view) < size:
        return FrameBlock([], header.offset, "partial", bad_end=header.end)
    body = view[FRAME_HEADER_SIZE:]
    try:
        verify_frame(header, body)
    except CorruptRecord as exc:
        return FrameBlock([], header.offset, "bad", exc, bad_end=header.end)
    return FrameBlock([(header, body)], header.end, "block")
