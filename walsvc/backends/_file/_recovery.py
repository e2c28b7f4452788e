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
    #: Size of the segment file: past ``offset`` it holds only zeros (the runway).
    size: int


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
        return Tail(first_seq, fd, 0, first_seq, 0, 0)
    segment = segments[-1]
    path = directory.segment_path(segment)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        offset, next_seq, last_timetick = _scan(directory, segment, fd, path)
    except BaseException:
        os.close(fd)
        raise
    return Tail(segment, fd, offset, next_seq, last_timetick, os.fstat(fd).st_size)


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
        if block.stop in ("bad", "partial") and _only_zeros_after(fd, offset):
            block.stop = "eof"  # the writer's zero-filled runway: a clean end
        if block.stop in ("bad", "partial") and not _is_torn(fd, offset, next_seq):
            error = block.error or f"frame at offset {offset} runs past the end of the file"
            raise CorruptRecord(f"{path}: {error}; valid frames follow it") from None
        if block.stop != "eof":
            os.ftruncate(fd, offset)
            os.fsync(fd)
        last_timetick = 0 if last_body is None else last_timetick_of_run(last_body)
        return offset, next_seq, last_timetick


def _only_zeros_after(fd: int, offset: int) -> bool:
    """True if the file holds only zero bytes from ``offset`` to its end."""
    size = os.fstat(fd).st_size
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 20), offset)
        if not chunk:
            break
        if chunk.count(0) != len(chunk):
            return False
        offset += len(chunk)
    return True


def _is_torn(fd: int, offset: int, next_seq: int) -> bool:
    """A crash mid-write leaves a prefix of the last frame (perhaps then zeros) and
    nothing else, so the bad frame at ``offset`` (which would start at record
    ``next_seq``) is torn unless what follows it holds the rest of a log: a chain of
    valid, consecutively numbered frames, numbered past ``next_seq``, that runs to the
    end of the file (or to zeros, or to a torn prefix of its next frame). Frames that
    merely appear inside a torn payload are followed by more payload bytes, so their
    chain breaks before the end and they do not count."""
    data = os.pread(fd, os.fstat(fd).st_size - offset, offset)
    at = data.find(MAGIC, 1)
    while at != -1:
        if _chain_reaches_end(data, at, next_seq):
            return False
        at = data.find(MAGIC, at + 1)
    return True


def _chain_reaches_end(data: bytes, at: int, after_seq: int) -> bool:
    view = memoryview(data)
    expected: int | None = None
    while True:
        if at == len(data) or (data[at] == 0 and not data[at:].strip(b"\0")):
            return expected is not None  # the chain reached the end (or only zeros remain)
        if len(view) - at < FRAME_HEADER_SIZE:
            # The log's own torn tail: a prefix of a header, after a valid chain.
            return expected is not None and MAGIC.startswith(data[at : at + 4])
        try:
            header = parse_frame_header(view, at, at)
        except CorruptRecord:
            return False
        body = view[at + FRAME_HEADER_SIZE : at + FRAME_HEADER_SIZE + header.body_length]
        if len(body) != header.body_length:
            # The log's own torn tail: the next frame, cut short by the end of the file.
            return expected is not None and header.first_seq == expected
        if expected is None:
            if header.first_seq <= after_seq:
                return False
        elif header.first_seq != expected:
            return False
        try:
            verify_frame(header, body)
        except CorruptRecord:
            return False
        expected = header.end_seq
        at += FRAME_HEADER_SIZE + header.body_length
