"""Reading a pchannel's topic by offset: its true end, ranges, the newest message.

Tansu deviation: its high watermark is the base offset of the last record batch + 1, not
the last offset + 1. ``end`` therefore reads from the high watermark - 1 up to the last
record the broker returns (fetches return whole batches), which is exact on Apache Kafka
too (there the high watermark - 1 is the last record).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from walsvc.core._codec import timetick_of
from walsvc.core._errors import BackendUnavailable, WALTruncated

from ._client import new_consumer, stop_quietly
from ._options import KafkaOptions
from ._records import Kind, classify, decode_mark

__all__ = ("LogReader",)

_SETTLE: Final = 0.02  # an empty fetch this long after the known last record ends a read
_WINDOW: Final = 64


class LogReader:
    """One consumer for the backend's own reads (tail, gaps), one read at a time."""

    __slots__ = ("_consumer", "_lock", "_options", "_servers", "topic", "tp")

    def __init__(self, servers: list[str], topic: str, options: KafkaOptions) -> None:
        self._servers = servers
        self._options = options
        self.topic = topic
        self.tp = TopicPartition(topic, 0)
        self._consumer: Any = None
        self._lock = asyncio.Lock()

    async def _ready(self) -> Any:
        if self._consumer is None:
            consumer = await new_consumer(self._servers, self._options, max_wait=_SETTLE)
            consumer.assign([self.tp])
            self._consumer = consumer
        return self._consumer

    async def aclose(self) -> None:
        """Stop the consumer. Idempotent."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_quietly(consumer)

    async def bounds(self) -> tuple[int, int]:
        """(first retained offset, true end offset)."""
        async with self._lock:
            return await self._bounds()

    async def _bounds(self) -> tuple[int, int]:
        consumer = await self._ready()
        try:
            async with asyncio.timeout(self._options.request_timeout):
                first = (await consumer.beginning_offsets([self.tp]))[self.tp]
                watermark = (await consumer.end_offsets([self.tp]))[self.tp]
        except (TimeoutError, KafkaError) as exc:
            raise BackendUnavailable(f"cannot read the offsets of {self.topic}: {exc!r}") from exc
        if watermark <= first:
            return first, watermark
        records = await self._read(watermark - 1, watermark, to_end=True)
        return first, max(watermark, records[-1].offset + 1) if records else watermark

    async def read(self, start: int, stop: int) -> list[Any]:
        """Every record with ``start <= offset < stop`` (``stop`` at most the true end)."""
        async with self._lock:
            return await self._read(start, stop, to_end=False)

    async def _read(self, start: int, stop: int, *, to_end: bool) -> list[Any]:
        consumer = await self._ready()
        out: list[Any] = []
        if start >= stop and not to_end:
            return out
        consumer.seek(self.tp, start)
        last = start - 1
        try:
            async with asyncio.timeout(self._options.request_timeout):
                while True:
                    reached = last >= stop - 1
                    if reached and not to_end:
                        return out
                    wait_ms = int((_SETTLE if reached else 1.0) * 1000)
                    got = (await consumer.getmany(self.tp, timeout_ms=wait_ms)).get(self.tp, [])
                    if not got:
                        if reached:
                            return out
                        continue
                    for record in got:
                        if to_end or record.offset < stop:
                            out.append(record)
                        last = record.offset
        except OffsetOutOfRangeError as exc:
            raise WALTruncated(f"{self.topic}: offset {start} was truncated") from exc
        except (TimeoutError, KafkaError) as exc:
            raise BackendUnavailable(
                f"cannot read offsets [{start}, {stop}) of {self.topic}: {exc!r}"
            ) from exc

    async def newest(self) -> tuple[int | None, int]:
        """(offset of the newest valid message, its timetick), or what the newest mark
        says if no message is retained after it; (None, 0) for a log without either."""
        async with self._lock:
            first, end = await self._bounds()
            stop = end
            window = _WINDOW
            while stop > first:
                start = max(first, stop - window)
                for record in reversed(await self._read(start, stop, to_end=False)):
                    kind, value = classify(record.offset, record.headers)
                    if kind is Kind.DATA:
                        assert value is not None
                        return record.offset, timetick_of(value)
                    if kind is Kind.MARK:
                        assert value is not None
                        mark = decode_mark(record.offset, value)
                        return (mark.latest if mark.latest >= 0 else None), mark.timetick
                stop = start
                window *= 2
            return None, 0
