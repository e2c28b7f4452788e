"""Open-time recovery of the newest segment: find the end of the valid frames and cut a
torn tail. Runs under the writers' lock, in a worker thread."""

from __future__ import annotations

import os
from typing import NamedTuple

from ..._errors import CorruptRecord
from ._directory import LogDirectory, fsync_directory
from ._frames import read_frames

__all__ = ("Tail", "recover_tail")


class Tail(NamedTuple):
    """Where the next frame goes: the newest segment (open on ``fd``), the byte offset
    in it, and the next sequence number."""

    segment: int
    fd: int
    offset: int
    next_seq: int


def recover_tail(directory: LogDirectory, first_seq: int) -> Tail:
    """Scan the newest segment (creating the first one for a new log, starting at
    ``first_seq``), truncate a torn last frame, and return the tail.

    A frame that fails its checks is a torn write only if it runs to the end of the file
    or is followed by nothing but zeros (what a crash mid-write leaves); anything else is
    corruption and raises ``CorruptRecord`` rather than dropping acknowledged records.
    """
    segments = directory.segments()
    if not segments:
        path = directory.segment_path(first_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fsync_directory(directory.path)
        return Tail(first_seq, fd, 0, first_seq)
    segment = segments[-1]
    path = directory.segment_path(segment)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        offset, next_seq = _scan(directory, segment, fd, path)
    except BaseException:
        os.close(fd)
        raise
    return Tail(segment, fd, offset, next_seq)


def _scan(directory: LogDirectory, segment: int, fd: int, path: str) -> tuple[int, int]:
    size = os.fstat(fd).st_size
    offset = 0
    next_seq = segment
    while True:
        block = read_frames(fd, offset)
        for header, _ in block.frames:
            if header.first_seq != next_seq:
                raise CorruptRecord(
                    f"{path}: frame at offset {header.offset} starts at record"
                    f" {header.first_seq}, expected {next_seq}"
                )
            directory.index.note(segment, header.first_seq, header.offset)
            next_seq = header.end_seq
        offset = block.next_offset
        if block.stop == "block":
            continue
        if block.stop == "eof":
            return offset, next_seq
        if block.stop == "bad" and not _is_torn(fd, offset, size, block.bad_end):
            raise CorruptRecord(f"{path}: {block.error}; valid frames follow it") from None
        os.ftruncate(fd, offset)
        os.fsync(fd)
        return offset, next_seq


def _is_torn(fd: int, offset: int, size: int, claimed_end: int | None) -> bool:
    if claimed_end is not None and claimed_end >= size:
        return True
    rest = os.pread(fd, size - offset, offset)
    return rest.count(0) == len(rest)
