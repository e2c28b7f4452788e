"""Scanners of a pchannel's topic: one group-less consumer each (assign + seek).

Only valid data records are delivered (see ``_records``); barriers, fillers, marks and
records that landed elsewhere than their writer expected are stepped over, so every
reader of the log agrees on what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from ..._errors import BackendUnavailable, WALClosed, WALTruncated
from ..._filter import Filter
from ..._ids import MessageId
from ..._message import ImmutableMessage
from .._base import BackendScanner
from ._client import new_consumer, stop_quietly
from ._ids import KafkaMessageId
from ._records import Kind, classify, decode_data

if TYPE_CHECKING:
    from ._backend import KafkaBackend

__all__ = ("KafkaScanner",)

_POLL_MS: Final = 200
_FETCH_WAIT: Final = 0.1


class KafkaScanner(BackendScanner):
    """Messages of one topic from a start offset (None: the first retained offset, or
    with ``latest`` the true end when the scanner first reads)."""

    __slots__ = (
        "_backend",
        "_bounds",
        "_closed",
        "_consumer",
        "_latest",
        "_position",
        "_selected",
        "_start",
    )

    reports_position = True

    def __init__(
        self, backend: KafkaBackend, start: int | None, latest: bool, selected: Filter
    ) -> None:
        self._backend = backend
        self._start = start
        self._latest = latest
        self._selected = selected
        self._closed = False
        self._consumer: Any = None
        self._position = -1 if start is None else start - 1
        # The end (for latest) is looked up from now on, not at the first read, so the
        # window in which an append can go unseen is one request, not the caller's delay.
        self._bounds: asyncio.Task[tuple[int, int]] | None = None
        if start is None:
            self._bounds = asyncio.get_running_loop().create_task(backend.reader.bounds())

    def position(self) -> MessageId | None:
        return KafkaMessageId(self._position) if self._position >= 0 else None

    async def _open(self) -> Any:
        backend = self._backend
        reader = backend.reader
        start = self._start
        if start is None:
            assert self._bounds is not None
            first, end = await self._bounds
            start = end if self._latest else first
            self._position = start - 1
        consumer = await new_consumer(backend.servers, backend.options, max_wait=_FETCH_WAIT)
        if self._closed:
            await stop_quietly(consumer, backend.options)
            raise WALClosed("scanner is closed")
        consumer.assign([reader.tp])
        consumer.seek(reader.tp, start)
        self._consumer = consumer
        return consumer

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        while True:
            if self._closed:
                raise WALClosed("scanner is closed")
            consumer = self._consumer
            if consumer is None:
                consumer = await self._open()
            tp = self._backend.reader.tp
            try:
                got = (await consumer.getmany(tp, timeout_ms=_POLL_MS)).get(tp, ())
            except OffsetOutOfRangeError as exc:
                raise WALTruncated(
                    f"kafka WAL {tp.topic}: position {self._position + 1} was truncated"
                ) from exc
            except KafkaError as exc:
                if self._closed:
                    raise WALClosed("scanner is closed") from exc
                raise BackendUnavailable(f"reading {tp.topic} failed: {exc!r}") from exc
            if self._closed:
                raise WALClosed("scanner is closed")
            out: list[ImmutableMessage] = []
            selected = self._selected
            for record in got:
                kind, head = classify(record.offset, record.headers)
                if kind is Kind.DATA:
                    assert head is not None
                    message = decode_data(record.offset, head, record.value, selected)
                    if message is not None:
                        out.append(message)
            if got:
                self._position = got[-1].offset
            if out:
                return out

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.forget_scanner(self)
        bounds = self._bounds
        if bounds is not None and not bounds.done():
            bounds.cancel()
            with contextlib.suppress(BaseException):
                await bounds
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_quietly(consumer, self._backend.options)
