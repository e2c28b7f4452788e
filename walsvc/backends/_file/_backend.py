"""``file://PATH``: the durable local log, walsvc's embedded default.

``PATH`` is a directory (absolute with ``file:///abs``, relative with ``file://rel``);
each pchannel is a subdirectory. Options:

- ``sync``: ``"always"`` (default) acknowledges an append only after ``fdatasync``, so an
  acknowledged append survives a crash of the process or the machine. ``"none"``
  acknowledges after ``write``: it survives a process crash but NOT a machine crash or
  power loss, and such a crash can leave a tail that needs manual repair.
- ``segment_size``: bytes after which a new segment file starts (default 64 MiB);
  truncation deletes whole segments.
- ``poll_interval``: seconds between checks for appends made by another process
  (default 0.05); appends made in this process wake scanners at once.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeVar, final

from walsvc.backends._base import Backend, BackendScanner
from walsvc.backends._identity import this_writer
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    WALClosed,
    WALReadOnly,
)
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._metrics import WALMetrics

from ._directory import LogDirectory, fsync_directory
from ._format import segment_seq
from ._head import HeadFile, HeadState
from ._ids import FileMessageId
from ._recovery import recover_tail
from ._scanner import FileRunScanner, FileScanner
from ._seek import record_before_timetick
from ._subscriptions import FileSubscriptionStore
from ._writer import GroupCommitWriter
from ._writer_note import read_writer_note, write_writer_note

_S = TypeVar("_S", bound=FileScanner)

__all__ = ("FileBackend", "FileLayout", "SegmentFile")

_DEFAULT_SEGMENT_SIZE: Final = 64 * 1024 * 1024
_LOCK_RETRY_SECONDS: Final = 0.002


class SegmentFile(NamedTuple):
    """One segment file of a pchannel: its first record's sequence number, path and
    size in bytes (the newest segment's size includes its zero-filled runway)."""

    first_seq: int
    path: str
    size: int


class FileLayout(NamedTuple):
    """What a pchannel directory holds (``FileBackend.layout``): its path, what the head
    file says (writer term, durable end, first retained record, last timetick), the
    segment files, oldest first, and who opened it with the head's term, as its writer
    note says (None if the note does not say)."""

    path: str
    head: HeadState
    segments: tuple[SegmentFile, ...]
    writer: str | None


@final
class FileBackend(Backend):
    """One pchannel directory of the local log."""

    __slots__ = (
        "_closed",
        "_scanners",
        "_subscriptions",
        "_writer",
        "directory",
        "pchannel",
        "poll_interval",
        "read_only",
        "term",
    )

    scheme = "file"
    message_id_class = FileMessageId

    def __init__(
        self,
        directory: LogDirectory,
        pchannel: str,
        writer: GroupCommitWriter | None,
        term: int,
        poll_interval: float,
    ) -> None:
        self.directory = directory
        self.pchannel = pchannel
        self.read_only = writer is None
        self.term = term
        self.poll_interval = poll_interval
        self._writer = writer
        self._closed = False
        self._scanners: set[FileScanner] = set()
        self._subscriptions: FileSubscriptionStore | None = None

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> FileBackend:
        sync, segment_size, poll_interval = _parse_options(options)
        directory = _open_directory(location, pchannel, read_only=read_only)
        if read_only:
            return cls(directory, pchannel, None, 0, poll_interval)
        head = directory.head
        try:
            writer = await _take_over(directory, sync=sync, segment_size=segment_size)
        except BaseException:
            head.close()
            raise
        backend = cls(directory, pchannel, writer, writer_term(directory), poll_interval)
        # Checkpoint saves a kill interrupted leave temporary files: the writer's open
        # removes those no live scanner can still be writing.
        await asyncio.get_running_loop().run_in_executor(None, backend.subscriptions().sweep)
        return backend

    def record_into(self, metrics: WALMetrics) -> None:
        if self._writer is not None:
            self._writer.metrics = metrics

    def append(self, records: Sequence[bytes]) -> asyncio.Future[list[FileMessageId]]:
        if self._writer is None:
            raise WALReadOnly(f"file WAL {self.directory.path} was opened read-only")
        return self._writer.submit(records)

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        return self._start_scanner(FileScanner, deliver, selected)

    def read_runs(self, deliver: DeliverPolicy) -> FileRunScanner:
        """Every record from ``deliver`` as runs of raw envelopes (see ``FileRunScanner``)."""
        return self._start_scanner(FileRunScanner, deliver, Filter.everything())

    def _start_scanner(self, kind: type[_S], deliver: DeliverPolicy, selected: Filter) -> _S:
        if self._closed:
            raise WALClosed(f"file WAL {self.directory.path} is closed")
        if deliver.kind == "all":
            start = 0  # raised to the first retained record when the scanner starts
        elif deliver.kind == "latest":
            start = self.directory.head.read().durable_end
        else:
            seq = _seq_of(deliver.message_id)
            start = seq if deliver.kind == "start_from" else seq + 1
        scanner = kind(self, start, selected)
        if deliver.kind == "all":
            scanner._deliver_from = self.directory.head.read().first_seq
        self._scanners.add(scanner)
        return scanner

    def forget_scanner(self, scanner: FileScanner) -> None:
        self._scanners.discard(scanner)

    async def latest_message_id(self) -> MessageId | None:
        end = self._head().durable_end
        return FileMessageId(end - 1) if end else None

    async def last_timetick(self) -> int:
        return self._head().last_timetick

    def _head(self) -> HeadState:
        try:
            return self.directory.head.read()
        except OSError as exc:
            raise BackendUnavailable(f"cannot read {self.directory.head.path}: {exc}") from exc

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        """A frame within ``_seek.NEAR`` bytes before the first record with a tick at or
        above ``timetick``, found by binary search over segments and then bytes."""
        if self._closed:
            raise WALClosed(f"file WAL {self.directory.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            seq = await loop.run_in_executor(None, record_before_timetick, self.directory, timetick)
        except OSError as exc:
            raise BackendUnavailable(f"cannot read file WAL {self.directory.path}: {exc}") from exc
        return DeliverPolicy.all() if seq is None else DeliverPolicy.start_from(FileMessageId(seq))

    async def truncate(self, message_id: MessageId) -> None:
        if self._writer is None:
            raise WALReadOnly(f"file WAL {self.directory.path} was opened read-only")
        await self._writer.truncate(_seq_of(message_id))

    def subscriptions(self) -> FileSubscriptionStore:
        """Checkpoint files in ``subscriptions/`` of the pchannel's directory; usable on a
        read-only open too."""
        if self._subscriptions is None:
            self._subscriptions = FileSubscriptionStore(self.directory.path)
        return self._subscriptions

    async def layout(self) -> FileLayout:
        """The pchannel's head and segment files, for tools (``walsvc inspect``). Lists
        the directory and stats each segment in a worker thread; reads no record."""
        if self._closed:
            raise WALClosed(f"file WAL {self.directory.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, _layout_of, self.directory)
        except OSError as exc:
            raise BackendUnavailable(f"cannot read file WAL {self.directory.path}: {exc}") from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for scanner in list(self._scanners):
            await scanner.aclose()
        if self._writer is not None:
            await self._writer.aclose()
        self.directory.head.close()


def _layout_of(directory: LogDirectory) -> FileLayout:
    head = directory.head.read()
    segments = []
    for first_seq in directory.segments():
        path = directory.segment_path(first_seq)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:  # truncation deleted it meanwhile
            continue
        segments.append(SegmentFile(first_seq, path, size))
    writer = read_writer_note(directory.path, head.term)
    return FileLayout(directory.path, head, tuple(segments), writer)


def _open_directory(location: str, pchannel: str, *, read_only: bool) -> LogDirectory:
    """The pchannel's directory with its head file open (created for a new log's
    writer). A directory whose segments lost their head file is refused: a head made up
    now would hand out a term and ids the log already holds.

    Each check looks for segments first and at the head second. A log's first writer
    writes its head before it makes a segment, and a head never goes back to missing or
    empty, so segments seen first mean the head was there before the look at it. In the
    other order, an open racing another process's creation of the log could see the head
    missing (or empty), then the segment made meanwhile, and refuse a healthy log as one
    that lost its head (seen under load in ``test_concurrent_first_opens_store_one_version``).
    """
    if not location:
        raise InvalidArgument("file:// URL needs a path: file:///abs/dir or file://rel/dir")
    path = os.path.abspath(os.path.join(os.path.expanduser(location), pchannel))
    head_path = os.path.join(path, "head")
    try:
        holds_segments = _holds_segments(path)
        exists = os.path.exists(head_path)
        if holds_segments and not exists:
            raise _lost_head(path, "missing", f"file://{location} {pchannel}")
        if read_only:
            if not exists:
                raise InvalidArgument(f"no file WAL for pchannel {pchannel!r} at {path}")
        else:
            os.makedirs(path, exist_ok=True)
        head = HeadFile(head_path, writable=not read_only)
    except OSError as exc:
        if not read_only and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise WALReadOnly(
                f"cannot open file WAL at {path} for writing ({exc}); readers open it with"
                " read_only=True"
            ) from exc
        raise BackendUnavailable(f"cannot open file WAL at {path}: {exc}") from exc
    directory = LogDirectory(path, head)
    if directory.segments() and head.empty():
        head.close()
        raise _lost_head(path, "empty", f"file://{location} {pchannel}")
    return directory


def _holds_segments(path: str) -> bool:
    try:
        return any(segment_seq(name) is not None for name in os.listdir(path))
    except FileNotFoundError:
        return False


def _lost_head(path: str, how: str, target: str) -> CorruptRecord:
    return CorruptRecord(
        f"{path}: the head file is {how}, but the directory holds segments (its writer term,"
        " durable end and first record are not rebuilt silently): stop every writer of the"
        f" pchannel, then run `walsvc check {target} --repair`"
    )


def writer_term(directory: LogDirectory) -> int:
    return directory.head.read().term


async def _take_over(
    directory: LogDirectory, *, sync: bool, segment_size: int
) -> GroupCommitWriter:
    """Become the pchannel's writer: under the lock, bump the term (fencing every older
    writer), recover the tail, and publish the durable end."""
    head = directory.head
    # flock offers no awaitable wait; polling the non-blocking form keeps this cancellable.
    while not head.try_lock():  # noqa: ASYNC110
        await asyncio.sleep(_LOCK_RETRY_SECONDS)
    try:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _recover_locked, directory, sync, segment_size)
    except OSError as exc:  # a full disk, an I/O error: the open may succeed later
        raise BackendUnavailable(f"cannot recover file WAL {directory.path}: {exc}") from exc
    finally:
        head.unlock()


def _recover_locked(directory: LogDirectory, sync: bool, segment_size: int) -> GroupCommitWriter:
    head = directory.head
    state = head.read()
    term = state.term + 1
    head.write(state._replace(term=term), sync=True)
    fsync_directory(directory.path)
    tail = recover_tail(directory, state)
    last_timetick = max(state.last_timetick, tail.last_timetick)
    head.write(
        HeadState(term, tail.next_seq, state.first_seq, last_timetick, tail.segment, tail.offset),
        sync=True,
    )
    write_writer_note(directory.path, term, this_writer())
    return GroupCommitWriter(directory, term, tail, sync=sync, segment_size=segment_size)


def _parse_options(options: Mapping[str, Any]) -> tuple[bool, int, float]:
    unknown = set(options) - {"sync", "segment_size", "poll_interval"}
    if unknown:
        raise TypeError(f"unknown option(s) for file:// WALs: {', '.join(sorted(unknown))}")
    sync = options.get("sync", "always")
    if sync not in ("always", "none"):
        raise InvalidArgument(f"sync must be 'always' or 'none', not {sync!r}")
    segment_size = options.get("segment_size", _DEFAULT_SEGMENT_SIZE)
    if not isinstance(segment_size, int) or segment_size < 4096:
        raise InvalidArgument(f"segment_size must be an int >= 4096, not {segment_size!r}")
    poll_interval = options.get("poll_interval", 0.05)
    if not isinstance(poll_interval, int | float) or not 0 < poll_interval <= 60:
        raise InvalidArgument(f"poll_interval must be seconds in (0, 60], not {poll_interval!r}")
    return sync == "always", segment_size, float(poll_interval)


def _seq_of(message_id: MessageId | None) -> int:
    if not isinstance(message_id, FileMessageId):
        raise InvalidArgument(f"{message_id!r} is not a file:// message id")
    return message_id.seq
