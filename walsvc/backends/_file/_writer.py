"""Group commit: every append queued while a batch is being made durable goes into the
next batch, written with one ``write`` and one ``fdatasync`` in another thread. There is
one thread hop per batch, never one per record.

A batch that needs no new segment and no runway goes to a ``_ccommit.Committer``: the
same steps on a thread that never takes the GIL, which signals an eventfd the event loop
watches (see ``_ccommit.c`` for why). The others, and every batch when walsvc was built
without a C compiler, go to a Python worker thread (``_write``, and the rest of the
writer's file operations: ``_segment_writer``). Either way one batch is in flight at a
time, and a truncation waits its turn between batches.

Once a batch finds that a newer writer opened the pchannel (its term in the head file
changed), nothing more is written and every append raises ``WALFenced`` from then on.

An I/O error (a full disk, EIO) fails the batch it hit with ``AppendOutcomeUnknown``, not
the writer: before the next batch, under the lock, the writer cuts the log back to the
head's durable end (nothing after it was acknowledged: its segment is truncated there, a
segment a failed roll made is removed) and goes on from there. If the cut fails too, the
appends queued meanwhile fail with ``BackendUnavailable`` (nothing of them was written)
and the next append tries again; so a writer whose disk filled up appends again once
space is free, without a reopen.

Idle pchannels cost no thread: the commit thread exits once it has waited
``COMMIT_THREAD_IDLE`` seconds for a batch (the next batch starts another), and the
worker threads are a pool every writer of the process shares (``_workers``; they take
only the batches that roll a segment or extend the runway when the commit thread is
there). A child forked from the process inherits no thread: its inherited writers fail
every append with ``WALClosed``, and closing one there only closes its descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Final

from walsvc.core._codec import timetick_of
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    WALClosed,
    WALError,
)
from walsvc.core._metrics import WALMetrics

from ._directory import LogDirectory
from ._format import encode_frames
from ._ids import FileMessageId
from ._recovery import Tail
from ._segment_writer import SegmentWriter
from ._workers import worker_pool

try:
    from . import _ccommit
except ImportError:  # built without a C compiler: every batch takes the worker thread
    _ccommit = None  # type: ignore[assignment]
if not hasattr(os, "eventfd"):  # not Linux: the loop cannot watch the thread's signal
    _ccommit = None  # type: ignore[assignment]

__all__ = ("COMMIT_THREAD_IDLE", "GroupCommitWriter")

#: Seconds a commit thread waits for the next batch before it exits (read when a writer
#: starts its committer; tests make it short).
COMMIT_THREAD_IDLE = 1.0

#: The writers alive in this process: a child forked from it must not use them.
_writers: Final[weakref.WeakSet[GroupCommitWriter]] = weakref.WeakSet()


def _refuse_inherited_writers() -> None:
    """In a forked child: the writers' threads stayed in the parent, so every writer it
    inherited fails its appends at once instead of waiting for a thread that is not
    there (the writers it opens itself get a worker pool of their own: ``_workers``)."""
    parent = os.getppid()
    for writer in list(_writers):
        writer._failure = WALClosed(
            f"file WAL {writer._directory.path} was opened in process {parent}; a forked"
            " child must open the WAL itself"
        )
        writer._closed = True
        # Nothing is in flight here: a batch in flight at the fork is the parent's.
        writer._in_flight, writer._held, writer._records, writer._calls = False, 0, [], []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refuse_inherited_writers)

#: One ``submit``: the caller's future and how many records it queued.
_Call = tuple[asyncio.Future[list[FileMessageId]], int]


class GroupCommitWriter(SegmentWriter):
    """The single writer of one pchannel directory (for one term)."""

    __slots__ = (
        "__weakref__",
        "_broken",
        "_calls",
        "_closed",
        "_committer",
        "_committing",
        "_failure",
        "_held",
        "_idle",
        "_in_flight",
        "_kicked",
        "_loop",
        "_next_seq",
        "_notify_fd",
        "_pid",
        "_records",
        "_use_committer",
        "metrics",
    )

    def __init__(
        self, directory: LogDirectory, term: int, tail: Tail, *, sync: bool, segment_size: int
    ) -> None:
        super().__init__(directory, term, tail, sync=sync, segment_size=segment_size)
        self._next_seq = tail.next_seq
        self._records: list[bytes] = []
        self._calls: list[_Call] = []
        self._in_flight = False  # a batch (or a truncation) is in a thread
        self._kicked = False  # a _kick is scheduled on the loop
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first append
        self._idle: asyncio.Future[None] | None = None  # set when no batch is in flight
        self._held = 0  # truncations waiting for their turn: start no batch meanwhile
        self._failure: WALError | None = None
        # The I/O error that failed the last batch, until a cut back to the durable end
        # (``_recover``) succeeds: no batch starts meanwhile.
        self._broken: str | None = None
        self._closed = False
        # The GIL-free committer, made with the first batch it can take; its thread runs
        # while batches come (if no thread can be started, every batch takes a worker).
        self._use_committer = _ccommit is not None
        self._committer: _ccommit.Committer | None = None
        self._notify_fd = -1
        # The batch the committer has: (calls, first seq, count, offset, segment, size,
        # perf_counter at its hand-off).
        self._committing: tuple[list[_Call], int, int, int, int, int, float] | None = None
        self._pid = os.getpid()
        #: Where each commit's time, records and bytes and each new segment are counted
        #: (set by ``FileBackend.record_into``; None: not counted).
        self.metrics: WALMetrics | None = None
        _writers.add(self)

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record will get."""
        return self._next_seq

    def submit(self, records: Sequence[bytes]) -> asyncio.Future[list[FileMessageId]]:
        """Queue records; the future resolves with their ids once they are durable."""
        if self._failure is not None:
            raise type(self._failure)(str(self._failure))
        if self._closed:
            raise WALClosed(f"file WAL {self._directory.path} is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[list[FileMessageId]] = loop.create_future()
        self._records += records
        self._calls.append((future, len(records)))
        if not (self._in_flight or self._kicked):
            self._kicked = True
            loop.call_soon(self._kick)
        return future

    # A batch goes to a thread as soon as none is in flight: from _kick (the first append
    # after an idle spell; call_soon puts it behind the callbacks already ready, so
    # producers woken together land in one batch) or from _finish (appends queued while
    # the last batch was on the disk). Callbacks, not a flusher task: one loop iteration
    # less per batch.

    def _kick(self) -> None:
        self._kicked = False
        if not (self._in_flight or self._held) and self._records:
            self._start()

    def _start(self) -> None:
        """Hand everything queued to the commit thread (or the worker thread) as one
        batch; after an I/O error, cut the log back to its durable end first."""
        if self._broken is not None:
            self._recover()
            return
        records, calls = self._records, self._calls
        self._records, self._calls = [], []
        if self._failure is not None:
            _fail(calls, self._failure)
            return
        first = self._next_seq
        offset, segment = self._offset, self._segment  # before the thread moves them
        started = time.perf_counter() if self.metrics is not None else 0.0
        try:
            data = encode_frames(first, records)
            last_timetick = timetick_of(records[-1])
            committer = self._committer_for(len(data))
            if committer is not None:
                try:
                    committer.commit(
                        self._fd,
                        data,
                        offset,
                        self._sync,
                        first + len(records),
                        last_timetick,
                        segment,
                    )
                except OSError:  # no thread for it: the workers take every batch from now on
                    self._use_committer = False
                else:
                    self._committing = (
                        calls,
                        first,
                        len(records),
                        offset,
                        segment,
                        len(data),
                        started,
                    )
                    self._in_flight = True
                    return
            written = worker_pool().submit(self._write, data, first, len(records), last_timetick)
        except BaseException as exc:  # a bug: never leave callers waiting
            self._failure = AppendOutcomeUnknown(f"the writer stopped: {exc!r}")
            _fail(calls, self._failure)
            raise
        self._in_flight = True
        loop = self._loop
        assert loop is not None
        size = len(data)
        count = len(records)

        def written_on_worker(done: Future[None]) -> None:
            # On the worker's thread. A loop closed with this batch in flight (its WAL
            # was never closed) has nobody waiting for the answers: the batch is on disk
            # or not, as a crash would leave it, and the next open recovers either.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(
                    self._finish,
                    done.exception(),
                    calls,
                    first,
                    count,
                    offset,
                    segment,
                    size,
                    started,
                )

        written.add_done_callback(written_on_worker)

    def _committer_for(self, size: int) -> _ccommit.Committer | None:
        """The commit thread, if it can take the next batch (``size`` bytes), else None:
        the worker thread takes it."""
        if not (self._use_committer and self._committable(size)):
            return None
        return self._committer or self._start_committer()

    def _start_committer(self) -> _ccommit.Committer | None:
        """Make the committer and watch its eventfd; None (and the worker threads from
        then on) if the system refuses a descriptor."""
        loop = self._loop
        assert loop is not None
        try:
            notify_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except OSError:
            self._use_committer = False
            return None
        try:
            committer = _ccommit.Committer(
                self._directory.head.fd, self._term, notify_fd, COMMIT_THREAD_IDLE
            )
            loop.add_reader(notify_fd, self._committed)
        except OSError:
            os.close(notify_fd)
            self._use_committer = False
            return None
        self._committer, self._notify_fd = committer, notify_fd
        return committer

    def _committed(self) -> None:
        """On the loop, when the commit thread signalled its eventfd."""
        try:
            os.eventfd_read(self._notify_fd)
        except BlockingIOError:  # a spurious wake-up
            return
        committer, batch = self._committer, self._committing
        assert committer is not None
        assert batch is not None
        self._committing = None
        calls, first, count, offset, segment, size, started = batch
        error: BaseException | None
        try:
            status, value = committer.outcome()
        except Exception as exc:  # a bug: answer the batch's callers, never leave them waiting
            error = AppendOutcomeUnknown(f"the commit thread failed: {exc!r}")
        else:
            error = self._error_of(status, value)
            if error is None:
                self._offset = offset + size
        self._finish(error, calls, first, count, offset, segment, size, started)

    def _error_of(self, status: int, value: int) -> BaseException | None:
        """The error a commit thread's outcome means (None: the batch is written)."""
        if status == _ccommit.OK:
            return None
        if status == _ccommit.FENCED:
            return self._fenced(value)
        if status == _ccommit.BAD_HEAD:
            return CorruptRecord(f"{self._directory.head.path}: head file fails its checks")
        return OSError(value, os.strerror(value))

    def _finish(
        self,
        error: BaseException | None,
        calls: list[_Call],
        first: int,
        count: int,
        offset_before: int,
        segment_before: int,
        size: int,
        started: float,
    ) -> None:
        """On the loop, once the commit or worker thread is done with a batch (``size``
        bytes, handed off at ``started``)."""
        self._in_flight = False
        metrics = self.metrics
        if metrics is not None and error is None:
            metrics.committed(started, count, size, self._segment != segment_before)
        if error is None:
            index = self._directory.index
            index.note(
                self._segment, first, offset_before if self._segment == segment_before else 0
            )
            self._next_seq = first + count
        elif isinstance(error, WALError):  # fenced, or a corrupt head file
            self._failure = error
        elif isinstance(error, OSError):
            self._broken = str(error)  # the next batch cuts the log back first (_recover)
        else:
            self._failure = AppendOutcomeUnknown(f"the writer stopped: {error!r}")
        if self._records and not self._held:
            self._start()  # queued during that batch: to the disk now
        if self._failure is not None:
            _fail(calls, self._failure)
        elif error is not None:
            _fail(
                calls,
                AppendOutcomeUnknown(
                    f"writing {self._directory.path} failed ({error}); appends in that"
                    " batch may or may not be durable (the next append cuts the log back"
                    " to its durable end first)"
                ),
            )
        else:
            seq = first
            for future, n in calls:
                if not future.done():  # the caller may have been cancelled
                    future.set_result(
                        [FileMessageId(seq)]
                        if n == 1
                        else list(map(FileMessageId, range(seq, seq + n)))
                    )
                seq += n
            self._directory.signal.wake()
        if not self._in_flight:
            self._signal_idle()

    def _recover(self) -> None:
        """After an I/O error: cut the log back to its durable end in the worker thread
        (``_cut_to_durable_end``), as the batch in flight; then start what was queued
        (``_recovered``)."""
        self._in_flight = True
        loop = self._loop
        assert loop is not None

        def cut_on_worker(done: Future[Tail]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: see _start
                loop.call_soon_threadsafe(self._recovered, done)

        worker_pool().submit(self._cut_to_durable_end).add_done_callback(cut_on_worker)

    def _recovered(self, done: Future[Tail]) -> None:
        """On the loop, once the cut ran: go on from the durable end, or fail what was
        queued (nothing of it was written) and leave the cut to the next append."""
        self._in_flight = False
        error = done.exception()
        if error is None:
            tail = done.result()
            os.close(self._fd)
            self._fd, self._segment, self._offset = tail.fd, tail.segment, tail.offset
            self._zeroed_to, self._next_seq = tail.size, tail.next_seq
            self._broken = None
            if self._records and not self._held:
                self._start()
        else:
            if isinstance(error, WALError):  # fenced, or a corrupt head file: final
                self._failure = failure = error
                self._broken = None
            else:
                failure = BackendUnavailable(
                    f"writing {self._directory.path} failed ({self._broken}), and cutting"
                    f" the log back to its durable end failed too ({error}); nothing of"
                    " this append was written (the next append tries again)"
                )
            calls, self._records, self._calls = self._calls, [], []
            _fail(calls, failure)
        if not self._in_flight:
            self._signal_idle()

    def _signal_idle(self) -> None:
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _wait_idle(self) -> None:
        """Return once no batch is in flight."""
        while self._in_flight:
            idle = self._idle
            if idle is None or idle.done():
                idle = self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(idle)

    async def truncate(self, seq: int) -> None:
        """Drop records up to and including ``seq``: record the new start durably, then
        delete every segment that holds nothing newer (never the newest segment)."""
        if self._failure is not None:
            raise type(self._failure)(str(self._failure))
        if seq >= self._next_seq:
            raise InvalidArgument(f"cannot truncate through record {seq}: not appended yet")
        # Between batches: the worker thread and the commit thread both write the head
        # file, and the writers' lock does not keep two threads of one process apart.
        self._held += 1
        try:
            await self._wait_idle()
            self._in_flight = True
            try:
                loop = asyncio.get_running_loop()
                doomed = await loop.run_in_executor(worker_pool(), self._truncate, seq)
            finally:
                self._in_flight = False
                self._signal_idle()
        finally:
            self._held -= 1
            if not (self._held or self._in_flight) and self._records:
                self._start()
        for segment in doomed:
            self._directory.index.forget(segment)

    async def aclose(self) -> None:
        """Finish every queued append, then release the segment and the commit thread."""
        self._closed = True
        if self._pid != os.getpid():  # a forked child: the loop and threads are the parent's
            if self._committer is not None:
                self._committer.close()  # marks it closed; the thread is not here
                os.close(self._notify_fd)
            os.close(self._fd)
            return
        while self._in_flight or self._records or self._held:
            if self._in_flight:
                await self._wait_idle()
            elif self._held:
                await asyncio.sleep(0)  # a truncation is about to take its turn
            else:
                self._start()
        if self._committer is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._notify_fd)
            self._committer.close()
            os.close(self._notify_fd)
        os.close(self._fd)


def _fail(calls: list[_Call], error: WALError) -> None:
    for future, _ in calls:
        if not future.done():
            future.set_exception(type(error)(str(error)))
