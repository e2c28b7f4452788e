"""The writer: group commit over one Kafka partition, fenced by an offset chain.

One batch is in flight at a time; appends queued meanwhile form the next batch. Every
record carries the offset it is expected to land at (the end after the previous acked
batch, or after the writer's barrier); a record that landed elsewhere is invalid and no
reader delivers it. When a batch lands elsewhere than expected, the gap is read: a
barrier in it (a newer writer: it lies after this writer's own barrier) fences this
writer for good (``WALFenced``); otherwise the batch failed retriably
(``BackendUnavailable``) and the chain continues from the true end.

A batch whose send failed without an answer (timeout, lost connection) is settled by a
*resync*: a filler record is appended and the log read from the expected offset to the
filler. Whatever sits at the expected offset now decides the batch for good: the batch
itself (valid: acked late), or anything else (the batch can never become valid: not
written). A resync that cannot finish within ``request_timeout`` leaves the batch
``AppendOutcomeUnknown`` and is retried before the next batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder

from ..._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    MessageTooLarge,
    WALClosed,
    WALError,
    WALFenced,
)
from ._client import stop_quietly
from ._ids import KafkaMessageId
from ._log import LogReader
from ._options import KafkaOptions
from ._records import (
    BARRIER,
    FILLER,
    Kind,
    Mark,
    classify,
    data_headers,
    mark_record,
    split_envelope,
)

__all__ = ("OffsetChainWriter", "append_barrier")

_RECORD_OVERHEAD: Final = 96  # Kafka record framing + walsvc headers, roughly
_RESYNC_PAUSE: Final = 0.1
_RESENDS: Final = 4


class _Pending:
    """One ``append`` call (or a mark): its records and the future of their ids."""

    __slots__ = ("future", "mark", "records", "size")

    def __init__(
        self,
        records: Sequence[bytes],
        mark: Mark | None,
        future: asyncio.Future[list[KafkaMessageId]],
    ) -> None:
        self.records = records
        self.mark = mark
        self.future = future
        self.size = sum(len(r) for r in records) + _RECORD_OVERHEAD * (len(records) + 1)

    @property
    def count(self) -> int:
        return len(self.records) + (self.mark is not None)


async def _send(producer: Any, builder: Any, topic: str, seconds: float) -> int:
    """Send one built batch and return its base offset. Raises ``TimeoutError`` or a
    ``KafkaError`` if the outcome is unknown."""
    async with asyncio.timeout(seconds):
        future = await producer.send_batch(builder, topic, partition=0)
        metadata = await future
    offset: int = metadata.offset
    return offset


async def append_barrier(producer: Any, topic: str, options: KafkaOptions) -> int:
    """Append a barrier record and return its offset: the new writer's term - 1."""
    builder = BatchBuilder(16384, 0)
    builder.append(timestamp=None, key=None, value=b"", headers=[(BARRIER, b"")])
    try:
        return await _send(producer, builder, topic, options.request_timeout)
    except (TimeoutError, KafkaError) as exc:
        raise BackendUnavailable(f"cannot append the writer's barrier to {topic}: {exc!r}") from exc


class OffsetChainWriter:
    """Appends for one read-write open; see the module docstring."""

    __slots__ = (
        "_call_limit",
        "_closing",
        "_fenced",
        "_loop",
        "_next",
        "_options",
        "_producer",
        "_queue",
        "_reader",
        "_resync",
        "_task",
        "barrier",
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
        self._fenced: WALFenced | None = None
        self._closing = False
        self._resync = False
        self._queue: deque[_Pending] = deque()
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
        pending = _Pending(records, mark, future)
        if pending.size > self._call_limit:
            future.set_exception(
                MessageTooLarge(
                    f"one append of {len(records)} records and about {pending.size} bytes"
                    f" exceeds what kafka WAL {self.topic} sends as one batch"
                    f" ({self._call_limit} bytes: max_batch_bytes or max_message_size,"
                    " whichever is larger); split the append_many call"
                )
            )
        elif self._fenced is not None:
            future.set_exception(WALFenced(str(self._fenced)))
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

    async def aclose(self) -> None:
        """Finish queued appends (bounded by the request timeout per batch), refuse new
        ones, stop the producer. Idempotent."""
        self._closing = True
        task = self._task
        if task is not None:
            try:
                async with asyncio.timeout(self._options.request_timeout * 2):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()
        self._fail_all(WALClosed(f"kafka WAL {self.topic} was closed"))
        await stop_quietly(self._producer, self._options)

    # -- the batch loop ---------------------------------------------------------------

    async def _drain(self) -> None:
        try:
            while self._queue:
                if self._fenced is not None:
                    self._fail_all(WALFenced(str(self._fenced)))
                    return
                if self._resync:
                    try:
                        await self._resynchronise()
                    except BackendUnavailable as exc:
                        self._fail_all(BackendUnavailable(f"{exc} (nothing was sent)"))
                        return
                    continue
                batch = self._take()
                try:
                    await self._send_batch(batch)
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
        except asyncio.CancelledError:
            self._fail_all(WALClosed(f"kafka WAL {self.topic} was closed"))
            raise
        finally:
            self._task = None

    def _take(self) -> list[_Pending]:
        batch = [self._queue.popleft()]
        size = batch[0].size
        limit = self._options.max_batch_bytes
        while self._queue and size + self._queue[0].size <= limit:
            item = self._queue.popleft()
            size += item.size
            batch.append(item)
        return batch

    def _build(self, batch: list[_Pending], expected: int) -> Any:
        builder = BatchBuilder(max(16384, sum(item.size for item in batch) + 1024), 0)
        offset = expected
        for item in batch:
            for envelope in item.records:
                head, payload = split_envelope(envelope)
                builder.append(
                    timestamp=None, key=None, value=payload, headers=data_headers(head, offset)
                )
                offset += 1
            if item.mark is not None:
                builder.append(
                    timestamp=None, key=None, value=b"", headers=mark_record(item.mark, offset)
                )
                offset += 1
        return builder

    async def _send_batch(self, batch: list[_Pending]) -> None:
        """Send ``batch`` until it lands where expected (acked), the writer is fenced, or
        ``_RESENDS`` attempts failed. A resend carries the same envelopes (same ticks)
        and happens before any later batch, so log order stays tick order among valid
        records; the invalid copies are dropped by every reader."""
        count = sum(item.count for item in batch)
        failure = ""
        for _ in range(_RESENDS):
            expected = self._next
            try:
                landed = await _send(
                    self._producer,
                    self._build(batch, expected),
                    self.topic,
                    self._options.request_timeout,
                )
            except MessageSizeTooLargeError as exc:
                self._fail(batch, MessageTooLarge(f"the broker refused the batch: {exc!r}"))
                return
            except (TimeoutError, KafkaError) as exc:
                try:
                    ours = await self._resynchronise()
                except BackendUnavailable as resync_error:
                    self._fail(
                        batch,
                        AppendOutcomeUnknown(
                            f"{self.topic}: sending a batch failed ({exc!r}) and the log could"
                            f" not be read back ({resync_error}); it may or may not be in the log"
                        ),
                    )
                    return
                if ours == expected:
                    self._succeed(batch, expected)  # it landed after all, where expected
                    return
                failure = f"sending failed ({exc!r}) and the batch did not land"
            else:
                if landed == expected:
                    self._next = expected + count
                    self._succeed(batch, expected)
                    return
                self._next = landed + count
                try:
                    self._check_barriers(await self._reader.read(expected, landed))
                except WALError:
                    self._resync = True  # the gap is unknown: check it before resending
                failure = (
                    f"batch landed at offset {landed}, expected {expected} (an older"
                    " writer's records came between)"
                )
            if self._fenced is not None:
                self._fail(batch, WALFenced(str(self._fenced)))
                return
            if self._resync:
                try:
                    await self._resynchronise()
                except BackendUnavailable:
                    break
                if self._fenced is not None:
                    self._fail(batch, WALFenced(str(self._fenced)))
                    return
        self._fail(batch, BackendUnavailable(f"{self.topic}: {failure}; not written, retry"))

    async def _resynchronise(self) -> int | None:
        """Append a filler, read from the expected offset to it, check for barriers, move
        the chain to after the filler. Returns the expected offset if a valid record sits
        there (a batch of ours that landed after all), else None. Raises
        ``BackendUnavailable`` if that does not finish within the request timeout."""
        start = self._next
        loop = self._loop
        deadline = loop.time() + self._options.request_timeout
        while True:
            builder = BatchBuilder(16384, 0)
            builder.append(timestamp=None, key=None, value=b"", headers=[(FILLER, b"")])
            try:
                filler = await _send(
                    self._producer, builder, self.topic, max(0.05, deadline - loop.time())
                )
                records = await self._reader.read(start, filler + 1)
                break
            except (TimeoutError, KafkaError, BackendUnavailable) as exc:
                if loop.time() >= deadline:
                    raise BackendUnavailable(
                        f"{self.topic}: cannot resynchronise: {exc!r}"
                    ) from exc
                await asyncio.sleep(_RESYNC_PAUSE)
        self._resync = False
        self._next = filler + 1
        self._check_barriers(records)
        if records and records[0].offset == start:
            try:
                kind, _ = classify(start, records[0].headers)
            except CorruptRecord:
                return None  # not a walsvc record, so not ours
            if kind in (Kind.DATA, Kind.MARK):
                return start
        return None

    def _check_barriers(self, records: Sequence[Any]) -> None:
        for record in records:
            if record.offset > self.barrier and any(k == BARRIER for k, _ in record.headers):
                self._fenced = WALFenced(
                    f"kafka WAL {self.topic}: the writer with barrier {self.barrier} (term"
                    f" {self.barrier + 1}) was fenced by a newer writer (barrier at offset"
                    f" {record.offset}, term {record.offset + 1})"
                )
                self._fail_all(self._fenced)
                return

    # -- settling futures -------------------------------------------------------------

    @staticmethod
    def _succeed(batch: list[_Pending], first: int) -> None:
        offset = first
        for item in batch:
            ids = [KafkaMessageId(offset + i) for i in range(len(item.records))]
            offset += item.count
            if not item.future.done():
                item.future.set_result(ids)

    @staticmethod
    def _fail(batch: Sequence[_Pending], error: WALError) -> None:
        for item in batch:
            if not item.future.done():
                item.future.set_exception(type(error)(str(error)))

    def _fail_all(self, error: WALError) -> None:
        queued, self._queue = list(self._queue), deque()
        self._fail(queued, error)
