"""The writer: group commit over one Kafka partition, fenced by an offset chain.

One batch is in flight at a time; appends queued meanwhile form the next batch. Every
record carries the offset it is expected to land at (the end after the previous acked
batch, or after the writer's barrier); a record that landed elsewhere is invalid and no
reader delivers it. When a batch lands elsewhere than expected, the gap is read: a copy
of the batch itself at the expected offset (a resend by the client) acknowledges it
there; a barrier in it (a newer writer: it lies after this writer's own barrier) fences
this writer for good (``WALFenced``, naming the barrier's writer if the barrier says who:
``_identity``); otherwise the batch is sent again after the true end (at most
``_RESENDS`` times, then the retriable ``BackendUnavailable``).

A batch whose send failed without an answer (timeout, lost connection) is settled by a
*resync*: a filler record is appended and the log read from the expected offset to the
filler. Whatever sits at the expected offset now decides the batch for good: the batch
itself, recognised by its contents (see ``_batch``: valid, acked late), or anything else
(the batch can never become valid: not written). A resync that cannot finish within
``request_timeout`` leaves the batch ``AppendOutcomeUnknown``; appends queued behind it
fail with ``BackendUnavailable`` (nothing of them was sent), and the resync is retried
before the next batch is sent, so no batch is ever sent while an earlier one may still
land where it expects to.

A log that was replaced under the writer (the topic deleted and created again: its end
or its first offset went back, or it has more than one partition; aiokafka speaks no
metadata version with topic ids) fails the batch and every later append
with ``WALTruncated``: the writer never acknowledges an id its own records may already
hold in the old log.

Closing (``begin_close``, then ``aclose``): appends go on for ``close_timeout`` seconds;
while closing, an append that fails retriably fails with ``WALClosed`` instead (nothing
written, and no retry will be). At the deadline the batch in flight fails with
``AppendOutcomeUnknown`` and everything queued with ``WALClosed``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder

from walsvc.backends._identity import WRITER, named_writer
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    MessageTooLarge,
    WALClosed,
    WALError,
    WALFenced,
    WALTruncated,
)

from ._batch import Landed, Pending, build, holds, send
from ._client import stop_quietly
from ._ids import KafkaMessageId
from ._log import LogReader
from ._options import KafkaOptions
from ._records import BARRIER, FILLER, Mark

__all__ = ("OffsetChainWriter",)

_RESYNC_PAUSE: Final = 0.1
_RESENDS: Final = 4


class _Broken(Exception):
    """Internal: the writer was fenced or its log replaced (``OffsetChainWriter.broken``)."""


class OffsetChainWriter:
    """Appends for one read-write open; see the module docstring."""

    __slots__ = (
        "_call_limit",
        "_close_handle",
        "_closing",
        "_log_start",
        "_loop",
        "_next",
        "_options",
        "_producer",
        "_queue",
        "_reader",
        "_resync",
        "_resync_failed",
        "_task",
        "barrier",
        "broken",
        "topic",
    )

    def __init__(
        self,
        producer: Any,
        reader: LogReader,
        options: KafkaOptions,
        barrier: int,
        call_limit: int,
    ) -> None:
        self._producer = producer
        self._call_limit = call_limit
        self._reader = reader
        self._options = options
        self.topic: str = reader.topic
        self.barrier = barrier
        self._next = barrier + 1
        self._log_start = 0  # the greatest first offset a produce response reported
        #: ``WALFenced`` or ``WALTruncated`` (log replaced) once the writer can never
        #: append again; every later append raises it.
        self.broken: WALError | None = None
        self._closing = False
        self._close_handle: asyncio.TimerHandle | None = None
        self._resync = False
        self._resync_failed = False
        self._queue: deque[Pending] = deque()
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    @property
    def known_end(self) -> int:
        """The end of the log as of the last acknowledged batch (or resync)."""
        return self._next

    def submit(
        self, records: Sequence[bytes], mark: Mark | None = None
    ) -> asyncio.Future[list[KafkaMessageId]]:
        """Queue records (and/or a mark) for the next batch; the future gets their ids."""
        future: asyncio.Future[list[KafkaMessageId]] = self._loop.create_future()
        pending = Pending(records, mark, future)
        if pending.size > self._call_limit:
            future.set_exception(
                MessageTooLarge(
                    f"one append of {len(records)} records and about {pending.size} bytes"
                    f" exceeds what kafka WAL {self.topic} sends as one batch"
                    f" ({self._call_limit} bytes: max_batch_bytes or max_message_size,"
                    " whichever is larger); split the append_many call"
                )
            )
        elif self.broken is not None:
            future.set_exception(type(self.broken)(str(self.broken)))
        elif self._closing:
            future.set_exception(WALClosed(f"kafka WAL {self.topic} is closed"))
        else:
            self._queue.append(pending)
            if self._task is None:
                self._task = self._loop.create_task(self._drain())
        return future

    async def idle(self) -> None:
        """Wait until everything queued so far was settled."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def begin_close(self) -> None:
        """Start closing: appends queued or made from now on have ``close_timeout``
        seconds to finish (see the module docstring). Idempotent."""
        if self._close_handle is None and not self._closing:
            self._close_handle = self._loop.call_later(self._options.close_timeout, self._abandon)

    def _abandon(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()  # _drain fails the batch in flight and the queue
        self._fail_all(WALClosed(f"kafka WAL {self.topic} was closed"))

    async def aclose(self) -> None:
        """Finish queued appends within ``close_timeout`` (``begin_close``), refuse new
        ones, stop the producer (``_client.STOP_WITHIN`` more at most). Idempotent."""
        self.begin_close()
        task = self._task
        if task is not None:
            await asyncio.wait({task})
        self._closing = True
        if self._close_handle is not None:
            self._close_handle.cancel()
        self._fail_all(WALClosed(f"kafka WAL {self.topic} was closed"))
        await stop_quietly(self._producer)

    # -- the batch loop ---------------------------------------------------------------

    async def _drain(self) -> None:
        try:
            while self._queue:
                if self.broken is not None:
                    self._fail_all(self.broken)
                    return
                if self._resync:
                    try:
                        await self._resynchronise(None, 0)
                    except BackendUnavailable as exc:
                        self._fail_all(BackendUnavailable(f"{exc} (nothing was sent)"))
                        return
                    except _Broken:
                        continue
                    continue
                batch = self._take()
                self._resync_failed = False
                try:
                    await self._send_batch(batch)
                except _Broken:
                    assert self.broken is not None
                    self._fail(batch, self.broken)
                except asyncio.CancelledError:
                    self._fail(
                        batch,
                        AppendOutcomeUnknown(
                            f"kafka WAL {self.topic} was closed while a batch was in flight"
                        ),
                    )
                    raise
                except Exception as exc:  # never leave a future pending
                    self._fail(batch, AppendOutcomeUnknown(f"{self.topic}: {exc!r}"))
                    self._resync = True
                if self._resync_failed and self._queue:
                    # The broker did not answer the batch nor the resync after it: what
                    # waited behind it fails now (retriably) instead of waiting as long.
                    self._fail_all(
                        BackendUnavailable(
                            f"kafka WAL {self.topic}: the broker did not answer within"
                            f" {self._options.request_timeout} s (request_timeout); nothing"
                            " of this append was sent"
                        )
                    )
                    return
        except asyncio.CancelledError:
            self._fail_all(WALClosed(f"kafka WAL {self.topic} was closed"))
            raise
        finally:
            self._task = None

    def _take(self) -> list[Pending]:
        batch = [self._queue.popleft()]
        size = batch[0].size
        limit = self._options.max_batch_bytes
        while self._queue and size + self._queue[0].size <= limit:
            item = self._queue.popleft()
            size += item.size
            batch.append(item)
        return batch

    async def _send_batch(self, batch: list[Pending]) -> None:
        """Send ``batch`` until it is found where expected (acked), the writer is fenced,
        or ``_RESENDS`` attempts failed. A resend carries the same envelopes (same ticks)
        and happens before any later batch, so log order stays tick order among valid
        records; the invalid copies are dropped by every reader. Raises ``_Broken``."""
        count = sum(item.count for item in batch)
        failure = ""
        timeout = self._options.request_timeout
        for _ in range(_RESENDS):
            expected = self._next
            try:
                sent = await send(self._producer, build(batch, expected), self.topic, timeout)
            except MessageSizeTooLargeError as exc:
                self._fail(batch, MessageTooLarge(f"the broker refused the batch: {exc!r}"))
                return
            except (TimeoutError, KafkaError) as exc:
                try:
                    ours = await self._resynchronise(batch, expected)
                except BackendUnavailable as resync_error:
                    self._resync = self._resync_failed = True
                    self._fail(
                        batch,
                        AppendOutcomeUnknown(
                            f"{self.topic}: sending a batch failed ({exc!r}) and the log could"
                            f" not be read back ({resync_error}); it may or may not be in the log"
                        ),
                    )
                    return
                if ours:
                    self._succeed(batch, expected)  # it landed after all, where expected
                    return
                failure = f"sending failed ({exc!r}) and the batch did not land"
            else:
                landed = self._check_landed(expected, sent)
                if landed == expected:
                    self._next = expected + count
                    self._succeed(batch, expected)
                    return
                self._next = landed + count
                try:
                    gap = await self._reader.read(expected, landed)
                except WALError as exc:
                    self._resync = True  # the end is known; a resync re-checks the gap
                    self._fail(
                        batch,
                        AppendOutcomeUnknown(
                            f"{self.topic}: the batch landed at offset {landed}, not at"
                            f" {expected}, and the records between could not be read"
                            f" ({exc}); an earlier copy of it may be at {expected}"
                        ),
                    )
                    return
                if holds(gap, expected, batch):  # a resend by the client: the first copy
                    self._succeed(batch, expected)
                    self._check_barriers(gap)
                    return
                self._check_barriers(gap)
                failure = (
                    f"batch landed at offset {landed}, expected {expected} (an older"
                    " writer's records came between)"
                )
            if self.broken is not None:
                raise _Broken
            if self._resync:
                try:
                    await self._resynchronise(None, 0)
                except BackendUnavailable:
                    break
        self._fail(batch, BackendUnavailable(f"{self.topic}: {failure}; not written, retry"))

    async def _resynchronise(self, batch: list[Pending] | None, expected: int) -> bool:
        """Append a filler, read from the chain's end to it, check for barriers, move the
        chain to after the filler. Returns whether ``batch`` sits valid at ``expected``
        (a batch of ours that landed after all). Raises ``BackendUnavailable`` if that
        does not finish within the request timeout, ``_Broken`` if the log was replaced
        or a newer writer's barrier was read."""
        start = self._next
        loop = self._loop
        deadline = loop.time() + self._options.request_timeout
        while True:
            builder = BatchBuilder(16384, 0)
            builder.append(timestamp=None, key=None, value=b"", headers=[(FILLER, b"")])
            try:
                filler = self._check_landed(
                    start,
                    await send(
                        self._producer, builder, self.topic, max(0.05, deadline - loop.time())
                    ),
                )
                records = await self._reader.read(start, filler + 1)
                break
            except WALTruncated as exc:  # our own offsets are gone: not a truncation of ours
                self._replaced(f"offset {start} is no longer in it ({exc})")
            except (TimeoutError, KafkaError, BackendUnavailable) as exc:
                if loop.time() >= deadline:
                    raise BackendUnavailable(
                        f"{self.topic}: cannot resynchronise within"
                        f" {self._options.request_timeout} s (request_timeout): {exc!r}"
                    ) from exc
                await asyncio.sleep(_RESYNC_PAUSE)
        self._resync = False
        self._next = filler + 1
        ours = batch is not None and holds(records, expected, batch)
        if ours:
            assert batch is not None
            self._succeed(batch, expected)
        self._check_barriers(records)
        return ours

    def _check_landed(self, expected: int, sent: Landed) -> int:
        """Where ``sent`` landed. Raises ``_Broken`` if the log was replaced: a record
        expected at ``expected`` landed before it, the log's first offset went back, or
        the producer sees the topic with other than one partition."""
        landed = sent.offset
        if landed < expected:
            self._replaced(f"a record expected at offset {expected} landed at {landed}")
        if sent.log_start >= 0:
            if sent.log_start < self._log_start:
                self._replaced(
                    f"its first offset went back from {self._log_start} to {sent.log_start}"
                )
            self._log_start = sent.log_start
        partitions = self._producer.client.cluster.partitions_for_topic(self.topic)
        if partitions is not None and len(partitions) != 1:
            self._replaced(f"it now has {len(partitions)} partitions")
        return landed

    def _replaced(self, detail: str) -> None:
        self.broken = WALTruncated(
            f"kafka WAL {self.topic} was deleted or replaced under its writer ({detail}):"
            " this writer appends no more; reopen the WAL"
        )
        self._fail_all(self.broken)
        raise _Broken

    def _check_barriers(self, records: Sequence[Any]) -> None:
        for record in records:
            if record.offset > self.barrier and any(k == BARRIER for k, _ in record.headers):
                self.broken = self._fenced(record.offset, record.headers)
                self._fail_all(self.broken)
                raise _Broken

    def _fenced(self, offset: int, headers: Sequence[tuple[str, bytes | None]]) -> WALFenced:
        """The error of this writer, fenced by the barrier at ``offset``: naming the
        barrier's writer if the barrier says who that is (best effort, see ``_identity``)."""
        who = named_writer(next((value for key, value in headers if key == WRITER), None))
        by = "" if who is None else f"{who}; "
        return WALFenced(
            f"kafka WAL {self.topic}: term {self.barrier + 1} was fenced by a writer with"
            f" term {offset + 1} ({by}its barrier at offset {offset}): another read-write"
            " open of this pchannel; readers open with read_only=True, which fences nothing"
        )

    # -- settling futures -------------------------------------------------------------

    @staticmethod
    def _succeed(batch: list[Pending], first: int) -> None:
        offset = first
        for item in batch:
            ids = [KafkaMessageId(offset + i) for i in range(len(item.records))]
            offset += item.count
            if not item.future.done():
                item.future.set_result(ids)

    def _fail(self, batch: Sequence[Pending], error: WALError) -> None:
        if error.retriable and self._close_handle is not None:
            error = WALClosed(f"kafka WAL {self.topic} is closing: {error}")
        for item in batch:
            if not item.future.done():
                item.future.set_exception(type(error)(str(error)))

    def _fail_all(self, error: WALError) -> None:
        queued, self._queue = list(self._queue), deque()
        self._fail(queued, error)
