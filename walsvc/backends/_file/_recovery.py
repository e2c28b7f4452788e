"""Open-time recovery of the newest segment: find the end of the valid frames and cut a
torn tail. Runs under the writers' lock, in a worker thread."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..._codec import last_timetick_of_run
from ..._errors import CorruptRecord
from ._directory import LogDirectory, fsync_directory
from ._format import FRAME_HEADER_SIZE, MAGIC, parse_frame_header, verify_frame
from ._frames import read_frames

__all__ = ("Tail", "recover_tail")


class Tail(NamedTuple):
    """Where the next frame goes: the newest segment (open on ``fd``), the byte offset
    in it, and the next sequence number."""

    segment: int
    fd: int
    offset: int
    next_seq: int
    #: Timetick of the newest record in the segment (0 if it holds none).
    last_timetick: int


def recover_tail(directory: LogDirectory, first_seq: int) -> Tail:
    """Scan the newest segment (creating the first one for a new log, starting at
    ``first_seq``), truncate a torn last frame, and return the tail.

    A frame that is incomplete or fails its checks is a torn write only if no valid frame
    follows it (a crash mid-write leaves a prefix of the last frame, possibly followed by
    zeros, and nothing else); otherwise it is corruption and raises ``CorruptRecord``
    rather than dropping acknowledged records.
    """
    segments = directory.segments()
    if not segments:
        path = directory.segment_path(first_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fsync_directory(directory.path)
        return Tail(first_seq, fd, 0, first_seq, 0)
    segment = segments[-1]
    path = directory.segment_path(segment)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        offset, next_seq, last_timetick = _scan(directory, segment, fd, path)
    except BaseException:
        os.close(fd)
        raise
    return Tail(segment, fd, offset, next_seq, last_timetick)


def _scan(directory: LogDirectory, segment: int, fd: int, path: str) -> tuple[int, int, int]:
    offset = 0
    next_seq = segment
    last_body: memoryview | None = None
    while True:
        block = read_frames(fd, offset)
        for header, body in block.frames:
            if header.first_seq != next_seq:
                raise CorruptRecord(
                    f"{path}: frame at offset {header.offset} starts at record"
                    f" {header.first_seq}, expected {next_seq}"
                )
            directory.index.note(segment, header.first_seq, header.offset)
            next_seq = header.end_seq
            last_body = body
        offset = block.next_offset
        if block.stop == "block":
            continue
        if block.stop in ("bad", "partial") and not _is_torn(fd, offset, next_seq):
            error = block.error or f"frame at offset {offset} runs past the end of the file"
            raise CorruptRecord(f"{path}: {error}; valid frames follow it") from None
        if block.stop != "eof":
            os.ftruncate(fd, offset)
            os.fsync(fd)
        last_timetick = 0 if last_body is None else last_timetick_of_run(last_body)
        return offset, next_seq, last_timetick


def _is_torn(fd: int, offset: int, next_seq: int) -> bool:
    """A crash mid-write leaves a prefix of the last frame and nothing after it, so the bad
    frame at ``offset`` (which would start at record ``next_seq``) is torn unless a valid
    frame follows it that continues the numbering. Frames that merely appear inside a
    payload (an archived segment, say) carry other numbers and do not count."""
    data = os.pread(fd, os.fstat(fd).st_size - offset, offset)
    rest = memoryview(data)
    at = data.find(MAGIC, 1)
    while at != -1:
        if len(rest) - at >= FRAME_HEADER_SIZE:
            header = parse_frame_header(rest, at, offset + at)
            body = rest[at + FRAME_HEADER_SIZE : at + FRAME_HEADER_SIZE + header.body_length]
            if len(body) == header.body_length and header.first_seq > next_seq:
                try:
                    verify_frame(header, body)
                except CorruptRecord:
                    pass
                else:
                    return False
        at = data.find(MAGIC, at + 1)
    return True
