"""Recovery: where the next frame goes after an open (``recover_tail``, cutting a torn
tail) and after a failed write (``cut_to_durable_end``). Runs under the writers' lock, in
a worker thread.

Recovery starts at the durable end the head file records (its segment and byte offset):
everything before it was acknowledged and is never read, cut or rewritten here (damage
there is reported by the readers that cross it, and by ``walsvc check``). After it lie
at most the frames of batches that were written but never acknowledged: whole ones are
kept (their appends may have been reported as failed or unknown; keeping them is what a
retry with the same idempotency key then finds), a torn one is cut.

A version 1 head does not say where the durable end lies: the newest segment is scanned
from its start instead, and a cut that would reach below the durable end refuses with
``CorruptRecord`` as well.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from walsvc.core._errors import CorruptRecord
from walsvc.core._runs import last_timetick_of_run

from ._directory import LogDirectory, fsync_directory
from ._format import FRAME_HEADER_SIZE, MAGIC, parse_frame_header, verify_frame
from ._frames import read_frames
from ._head import UNKNOWN, HeadState

__all__ = ("Tail", "cut_to_durable_end", "recover_tail")


class Tail(NamedTuple):
    """Where the next frame goes: the newest segment (open on ``fd``), the byte offset
    in it, and the next sequence number."""

    segment: int
    fd: int
    offset: int
    next_seq: int
    #: Timetick of the newest record kept after the durable end (0 if none).
    last_timetick: int
    #: Size of the segment file: past ``offset`` it holds only zeros (the runway).
    size: int


def recover_tail(directory: LogDirectory, state: HeadState) -> Tail:
    """The tail of the log whose head says ``state``, after cutting a torn write that
    follows the durable end (creating the first segment of a new log).

    Raises ``CorruptRecord`` if records the head calls durable are missing (a segment or
    bytes of one gone), or if a bad frame after the durable end is followed by valid
    frames that continue the numbering (damage, not a torn write: a crash leaves a prefix
    of the last frame and nothing after it).
    """
    segments = directory.segments()
    if not segments:
        if state.durable_end > state.first_seq:
            raise CorruptRecord(
                f"{directory.path}: the head file says records {state.first_seq} to"
                f" {state.durable_end - 1} are durable, but no segment file is left"
            )
        path = directory.segment_path(state.first_seq)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fsync_directory(directory.path)
        return Tail(state.first_seq, fd, 0, state.first_seq, 0, 0)
    if state.end_segment == UNKNOWN:  # a version 1 head: scan the newest segment
        start_segment, offset, next_seq = segments[-1], 0, segments[-1]
    else:
        start_segment, offset, next_seq = state.end_segment, state.end_offset, state.durable_end
        if start_segment not in segments:
            raise CorruptRecord(
                f"{directory.segment_path(start_segment)}: the segment holding the durable"
                f" end (record {state.durable_end}) is missing"
            )
    tail_segments = [s for s in segments if s >= start_segment]
    last_timetick = 0
    for i, segment in enumerate(tail_segments):
        newest = i == len(tail_segments) - 1
        if segment != start_segment and segment != next_seq:
            raise CorruptRecord(
                f"{directory.segment_path(segment)}: starts at record {segment}, but the"
                f" segment before it ends at record {next_seq}"
            )
        path = directory.segment_path(segment)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            directory.index.note(segment, next_seq, offset)
            offset, next_seq, tick = _scan(
                directory, segment, fd, path, offset, next_seq, may_cut=newest
            )
            if next_seq < state.durable_end:
                raise CorruptRecord(
                    f"{path}: the log ends at record {next_seq}, byte {offset}, but the head"
                    f" file says records up to {state.durable_end - 1} are durable: refusing"
                    " to cut acknowledged records (see `walsvc check`)"
                )
            if not newest and offset != os.fstat(fd).st_size:
                raise CorruptRecord(
                    f"{path}: bytes after the last frame (offset {offset}), and a newer"
                    " segment follows"
                )
        except BaseException:
            os.close(fd)
            raise
        last_timetick = max(last_timetick, tick)
        if newest:
            return Tail(segment, fd, offset, next_seq, last_timetick, os.fstat(fd).st_size)
        os.close(fd)
        offset = 0
    raise AssertionError("unreachable: tail_segments holds the start segment")


def cut_to_durable_end(directory: LogDirectory, state: HeadState) -> Tail:
    """The tail of the log after a write failed (a full disk, an I/O error), cut back to
    the durable end the head says (``state``): its segment truncated there, any newer
    segment (a failed roll's) removed. Unlike ``recover_tail`` it keeps no whole frame
    after the durable end: the writer that failed goes on, and may already have told a
    retry that its key is not in the log. The tail's descriptor is a new one (the
    writer's may be what failed); its segment ends at ``offset``."""
    segment, offset = state.end_segment, state.end_offset
    fd = os.open(directory.segment_path(segment), os.O_RDWR | os.O_CLOEXEC)
    try:
        newer = [s for s in directory.segments() if s > segment]
        for stale in newer:
            os.unlink(directory.segment_path(stale))
        os.ftruncate(fd, offset)
        os.fdatasync(fd)
        if newer:
            fsync_directory(directory.path)
    except BaseException:
        os.close(fd)
        raise
    return Tail(segment, fd, offset, state.durable_end, 0, offset)


def _scan(
    directory: LogDirectory,
    segment: int,
    fd: int,
    path: str,
    offset: int,
    next_seq: int,
    *,
    may_cut: bool,
) -> tuple[int, int, int]:
    """Walk the frames of ``segment`` from ``offset`` (where record ``next_seq`` starts);
    cut a torn tail if ``may_cut`` (the newest segment: an older one was complete when
    the next was started). Returns the end offset, the next sequence number and the
    timetick of the last record walked (0 if none)."""
    size = os.fstat(fd).st_size
    if size < offset:
        raise CorruptRecord(
            f"{path}: the durable end lies at byte {offset}, but the file holds {size} bytes:"
            " acknowledged records are missing"
        )
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
            if not may_cut:
                raise CorruptRecord(f"{path}: a bad frame at offset {offset}, and a newer segment")
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
