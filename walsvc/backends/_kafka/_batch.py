"""One batch of the Kafka writer: its records, how it is built and sent, and how it is
recognised in the log.

A batch is acknowledged only with the offsets of records that *are* it. The offset a
produce response names is trusted for the request it answers; but when a send's outcome
was unknown (a timeout, a lost connection), or when the batch landed elsewhere than
expected (aiokafka resends a batch after a lost connection, so an earlier copy may sit
where it was expected), the writer reads the log and acknowledges the batch at its
expected offset only if the records there are this batch, byte for byte: the same
walsvc headers (expected offset, envelope header with its unique timetick, or mark) and
the same payloads. A valid record of another batch at that offset (say, one whose own
outcome was reported unknown) never acknowledges this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from aiokafka.errors import KafkaError
from aiokafka.producer.message_accumulator import BatchBuilder

from walsvc.backends._identity import WRITER, this_writer
from walsvc.core._errors import BackendUnavailable

from ._ids import KafkaMessageId
from ._options import KafkaOptions
from ._records import BARRIER, Mark, data_headers, mark_record, split_envelope

__all__ = ("Landed", "Pending", "append_barrier", "build", "holds", "send")

RECORD_OVERHEAD: Final = 96  # Kafka record framing + walsvc headers, roughly


class Pending:
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
        self.size = sum(len(r) for r in records) + RECORD_OVERHEAD * (len(records) + 1)

    @property
    def count(self) -> int:
        return len(self.records) + (self.mark is not None)


def build(batch: Sequence[Pending], expected: int) -> Any:
    """The Kafka record batch of ``batch``, its records expecting offsets from
    ``expected`` on."""
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


def holds(records: Sequence[Any], expected: int, batch: Sequence[Pending]) -> bool:
    """Whether ``records`` (consumer records, in offset order) hold ``batch`` itself at
    ``expected``, ``expected + 1``, ... (each record as ``build`` lays it out there)."""
    at = {record.offset: record for record in records}
    offset = expected
    for item in batch:
        wanted: list[tuple[list[tuple[str, bytes]], bytes]] = []
        for envelope in item.records:
            head, payload = split_envelope(envelope)
            wanted.append((data_headers(head, offset + len(wanted)), payload))
        if item.mark is not None:
            wanted.append((mark_record(item.mark, offset + len(wanted)), b""))
        for headers, value in wanted:
            record = at.get(offset)
            if record is None or list(record.headers) != headers or (record.value or b"") != value:
                return False
            offset += 1
    return True


class Landed(NamedTuple):
    """Where a sent batch landed: its base offset, and the partition's first retained
    offset as the broker reported it with the acknowledgement (-1 if it did not)."""

    offset: int
    log_start: int


async def send(producer: Any, builder: Any, topic: str, seconds: float) -> Landed:
    """Send one built batch; where it landed. Raises ``TimeoutError`` or a
    ``KafkaError`` if the outcome is unknown."""
    async with asyncio.timeout(seconds):
        future = await producer.send_batch(builder, topic, partition=0)
        metadata = await future
    log_start = metadata.log_start_offset
    return Landed(metadata.offset, -1 if log_start is None else log_start)


async def append_barrier(producer: Any, topic: str, options: KafkaOptions) -> int:
    """Append a barrier record and return its offset: the new writer's term - 1. It
    names this process (``_identity``) for the error of the writer it fences."""
    builder = BatchBuilder(16384, 0)
    headers = [(BARRIER, b""), (WRITER, this_writer().encode())]
    builder.append(timestamp=None, key=None, value=b"", headers=headers)
    try:
        return (await send(producer, builder, topic, options.request_timeout)).offset
    except (TimeoutError, KafkaError) as exc:
        raise BackendUnavailable(
            f"cannot append the writer's barrier to {topic} within {options.request_timeout} s"
            f" (request_timeout): {exc!r}"
        ) from exc
