"""Verifying a local log frame by frame, and repairing what recovery may not repair by
itself (``walsvc check``).

``check`` reads every frame of every segment, never writes, and reports what it found:
damaged frames (file, offset, the records they held and whether those were acknowledged,
that is below the head file's durable end), records missing between segments, a torn
tail after the durable end, and a head file that is missing or fails its checks.

``repair`` fixes, under the writers' lock:
- a missing or damaged head file: rebuilt from the segments (the writer term above every
  term in the log, the durable end at the end of the valid frames, the first record of
  the oldest segment, the newest timetick);
- a torn tail after the durable end: cut, as a writer's open would.
Damage to acknowledged records is only cut with ``force``: the log then ends before the
first damaged frame (later segments are deleted) and the ids of the dropped records will
be handed out again; ``RepairReport.dropped`` says which. Stop every writer first: a
writer that kept an old head file open would not see a rebuilt one.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Final

from walsvc.core._errors import CorruptRecord, InvalidArgument
from walsvc.core._runs import last_timetick_of_run, offset_after

from ._directory import fsync_directory
from ._format import segment_name, segment_seq
from ._frames import read_frames
from ._head import UNKNOWN, HeadFile, HeadState
from ._seek import frame_from

__all__ = ("CheckReport", "Damage", "RepairReport", "SegmentInfo", "check", "repair")

_TERM_AT: Final = 24  # byte offset of the writer term in an envelope header


@dataclass(frozen=True)
class Damage:
    """Bytes of a segment that are not valid frames continuing the log."""

    path: str
    offset: int
    #: What is wrong, as the reader would say it.
    detail: str
    #: The first record the damaged bytes should hold, and the first one after them
    #: (None: nothing valid follows in that segment).
    first_seq: int
    resumes_at: int | None
    #: True if any record it covers was acknowledged (below the head's durable end).
    acknowledged: bool


@dataclass(frozen=True)
class SegmentInfo:
    """One segment as ``check`` walked it."""

    path: str
    first_seq: int
    records: int
    size: int
    #: Where its valid frames end, and the record number after them.
    valid_end: int
    next_seq: int


@dataclass
class CheckReport:
    """What ``check`` found."""

    path: str
    head: HeadState | None
    #: Why the head file cannot be used (None: it is fine).
    head_problem: str | None
    segments: list[SegmentInfo] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    #: Where valid frames end in the newest segment, and the records they hold.
    end_path: str | None = None
    end_offset: int = 0
    end_seq: int = 0
    #: Bytes after the valid frames that are neither zeros nor acknowledged (a torn write).
    torn_tail: int = 0
    #: The newest writer term and timetick found in a record.
    max_term: int = 0
    last_timetick: int = 0

    @property
    def ok(self) -> bool:
        """True if the log needs nothing: no damage, a good head, no torn tail."""
        return not self.damage and self.head_problem is None and not self.torn_tail

    @property
    def acknowledged_damage(self) -> list[Damage]:
        return [d for d in self.damage if d.acknowledged]


@dataclass(frozen=True)
class RepairReport:
    """What ``repair`` did (an empty ``actions`` list: nothing was needed)."""

    actions: list[str]
    #: (first, last) acknowledged record numbers dropped with ``force``, or None.
    dropped: tuple[int, int] | None


def check(path: str) -> CheckReport:
    """Verify the pchannel directory ``path`` (see the module docs); writes nothing."""
    if not os.path.isdir(path):
        raise InvalidArgument(f"{path} is not a file WAL pchannel directory")
    head, problem = _read_head(path)
    report = CheckReport(path, head, problem)
    durable_end = head.durable_end if head is not None else None
    segments = _segments(path)
    next_seq: int | None = None
    for i, segment in enumerate(segments):
        segment_path = os.path.join(path, segment_name(segment))
        if next_seq is not None and segment != next_seq:
            report.damage.append(
                Damage(
                    segment_path,
                    0,
                    f"starts at record {segment}; the segment before it ends at {next_seq}",
                    next_seq,
                    segment,
                    durable_end is None or next_seq < durable_end,
                )
            )
        newest = i == len(segments) - 1
        next_seq = _check_segment(report, segment_path, segment, newest, durable_end)
    if head is not None and next_seq is not None and next_seq < head.durable_end:
        report.damage.append(
            Damage(
                report.end_path or path,
                report.end_offset,
                f"the log ends at record {next_seq}, but the head file says records up to"
                f" {head.durable_end - 1} are durable",
                next_seq,
                None,
                True,
            )
        )
    return report


def _check_segment(
    report: CheckReport, path: str, segment: int, newest: bool, durable_end: int | None
) -> int:
    """Walk one segment into ``report``; returns the record number after its last
    valid frame."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        offset, next_seq, records, last_body = 0, segment, 0, None
        while True:
            block = read_frames(fd, offset)
            for header, body in block.frames:
                if header.first_seq != next_seq:
                    detail = f"frame starts at record {header.first_seq}, expected {next_seq}"
                    _damaged(
                        report, path, header.offset, detail, next_seq, header.first_seq,
                        durable_end,
                    )  # fmt: skip
                next_seq = header.end_seq
                records += header.count
                last_body = body
                _note_term(report, body, header.count)
            offset = block.next_offset
            if block.stop == "block":
                continue
            if block.stop == "eof" or not os.pread(fd, size - offset, offset).strip(b"\0"):
                break  # the end, or the writer's zero-filled runway
            resumed = frame_from(fd, offset + 1, size, next_seq + 1, 1 << 63, size)
            acknowledged = durable_end is None or next_seq < durable_end
            if resumed is None and newest and not acknowledged:
                report.torn_tail = size - offset  # a write cut short by a crash
                break
            detail = str(block.error) if block.error else "a frame runs past the end of the file"
            resumes_at = None if resumed is None else resumed[0].first_seq
            _damaged(report, path, offset, detail, next_seq, resumes_at, durable_end)
            if resumed is None:
                break
            offset, next_seq = resumed[0].offset, resumed[0].first_seq
        report.segments.append(SegmentInfo(path, segment, records, size, offset, next_seq))
        if newest:
            report.end_path, report.end_offset, report.end_seq = path, offset, next_seq
            if last_body is not None:
                report.last_timetick = max(report.last_timetick, last_timetick_of_run(last_body))
        return next_seq
    finally:
        os.close(fd)


def _damaged(
    report: CheckReport,
    path: str,
    offset: int,
    detail: str,
    first_seq: int,
    resumes_at: int | None,
    durable_end: int | None,
) -> None:
    acknowledged = durable_end is None or first_seq < durable_end
    report.damage.append(Damage(path, offset, detail, first_seq, resumes_at, acknowledged))


def _note_term(report: CheckReport, body: memoryview, count: int) -> None:
    """Keep the newest writer term (terms never go back in log order: a frame's last
    record has the greatest term so far)."""
    last = offset_after(body, count - 1)
    term = int.from_bytes(body[last + _TERM_AT : last + _TERM_AT + 8], "little")
    report.max_term = max(report.max_term, term)


def _segments(path: str) -> list[int]:
    found = (segment_seq(name) for name in os.listdir(path))
    return sorted(seq for seq in found if seq is not None)


def repair(path: str, *, force: bool = False) -> RepairReport:
    """Repair the pchannel directory ``path`` (see the module docs). Raises
    ``CorruptRecord`` naming the damage if acknowledged records are damaged and not
    ``force``."""
    report = check(path)
    damage = report.acknowledged_damage
    if damage and not force:
        first = damage[0]
        raise CorruptRecord(
            f"acknowledged records are damaged ({len(damage)} place(s); first: {first.path}"
            f" at byte {first.offset}, record {first.first_seq}: {first.detail}); nothing"
            " was changed. --force cuts the log before the first damage and drops every"
            " record after it"
        )
    head_path = os.path.join(path, "head")
    head = HeadFile(head_path, writable=True)
    try:
        if not head.try_lock():
            raise InvalidArgument(f"{path}: a writer is recovering or appending; stop it first")
        try:
            return _repair_locked(report, head, damage)
        finally:
            head.unlock()
    finally:
        head.close()


def _repair_locked(report: CheckReport, head: HeadFile, damage: list[Damage]) -> RepairReport:
    path = report.path
    actions: list[str] = []
    dropped: tuple[int, int] | None = None
    end_path, end_offset, end_seq = report.end_path, report.end_offset, report.end_seq
    if damage:  # forced: the log ends before the first damaged frame
        first = damage[0]
        last = max(report.end_seq, report.head.durable_end if report.head else 0) - 1
        dropped = (first.first_seq, last)
        end_path, end_offset, end_seq = first.path, first.offset, first.first_seq
        kept = [info for info in report.segments if info.path < first.path]
        if first.offset == 0 and kept:  # the whole segment goes: the log ends before it
            end_path, end_offset = kept[-1].path, kept[-1].valid_end
        for info in report.segments:
            if info.path > end_path:
                os.unlink(info.path)
                actions.append(f"deleted {info.path} (records after the damage)")
        actions.append(
            f"cut {first.path} at byte {first.offset}: dropped records {first.first_seq} to"
            f" {last}, acknowledged; their ids will be handed out again"
        )
    elif report.torn_tail and end_path is not None:
        actions.append(f"cut a torn write of {report.torn_tail} bytes at byte {end_offset}")
    if end_path is not None and os.path.getsize(end_path) > end_offset:
        fd = os.open(end_path, os.O_RDWR | os.O_CLOEXEC)
        try:
            tail = os.pread(fd, os.fstat(fd).st_size - end_offset, end_offset)
            if tail.strip(b"\0") or damage:  # zeros after the frames are a runway: kept
                os.ftruncate(fd, end_offset)
                os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(path)
    state = report.head
    if state is None or damage or report.head_problem is not None:
        segments = _segments(path)
        term = max(report.max_term, state.term if state is not None else 0) + 1
        end_segment = segment_seq(os.path.basename(end_path)) if end_path else None
        first_seq = segments[0] if segments else (state.first_seq if state else 0)
        if state is not None:
            first_seq = max(first_seq, min(state.first_seq, end_seq))
        rebuilt = HeadState(
            term,
            end_seq,
            first_seq,
            max(report.last_timetick, state.last_timetick if state is not None else 0),
            UNKNOWN if end_segment is None else end_segment,
            end_offset,
        )
        head.write(rebuilt, sync=True)
        fsync_directory(path)
        why = report.head_problem or "the durable end moved"
        actions.append(
            f"wrote a new head file ({why}): term {term}, records {first_seq} to {end_seq - 1}"
        )
    return RepairReport(actions, dropped)


def _read_head(path: str) -> tuple[HeadState | None, str | None]:
    head_path = os.path.join(path, "head")
    try:
        head = HeadFile(head_path, writable=False)
    except FileNotFoundError:
        return None, "the head file is missing"
    try:
        if head.empty():
            return None, "the head file is empty"
        return head.read(), None
    except CorruptRecord as exc:
        return None, str(exc)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise
        return None, str(exc)
    finally:
        head.close()
