"""Scanners of a pchannel's topic: one ``PartitionFetcher`` each (raw Fetch requests from
an offset, no consumer group).

Only valid data records are delivered (see ``_records``); barriers, fillers, marks and
records that landed elsewhere than their writer expected are stepped over, so every
reader of the log agrees on what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from walsvc.backends._base import BackendScanner
from walsvc.core._budget import DECODE_COST, STEP, turn
from walsvc.core._codec import decode_split
from walsvc.core._errors import WALClosed
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage

from ._batches import Walked
from ._fetch import PartitionFetcher
from ._ids import KafkaMessageId
from ._records import data_header

if TYPE_CHECKING:
    from ._backend import KafkaBackend

__all__ = ("KafkaScanner",)

_FETCH_WAIT: Final = 0.1


class KafkaScanner(BackendScanner):
    """Messages of one topic from a start offset (None: the first retained offset, or
    with ``latest`` the true end when the scanner first reads)."""

    __slots__ = (
        "_backend",
        "_bounds",
        "_closed",
        "_end",
        "_fetcher",
        "_latest",
        "_pending",
        "_position",
        "_selected",
        "_start",
        "_taken",
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
        self._fetcher: PartitionFetcher | None = None
        self._position = -1 if start is None else start - 1
        # The records of the last response not decoded yet: _pending[_taken:]; the
        # position after them is _end.
        self._pending: list[Walked] = []
        self._taken = 0
        self._end = self._position
        # The end (for latest) is looked up from now on, not at the first read, so the
        # window in which an append can go unseen is one request, not the caller's delay.
        self._bounds: asyncio.Task[tuple[int, int]] | None = None
        if start is None:
            self._bounds = asyncio.get_running_loop().create_task(backend.reader.bounds())

    def position(self) -> MessageId | None:
        return KafkaMessageId(self._position) if self._position >= 0 else None

    async def _open(self) -> PartitionFetcher:
        backend = self._backend
        reader = backend.reader
        start = self._start
        if start is None:
            assert self._bounds is not None
            first, end = await self._bounds
            start = end if self._latest else first
            self._position = start - 1
        fetcher = PartitionFetcher(
            backend.servers, backend.options, reader.tp, start, max_wait=_FETCH_WAIT
        )
        await fetcher.start()
        if self._closed:
            await fetcher.aclose()
            raise WALClosed("scanner is closed")
        self._fetcher = fetcher
        return fetcher

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        while True:
            if self._closed:
                raise WALClosed("scanner is closed")
            got = self._pending
            if not got:
                fetcher = self._fetcher
                if fetcher is None:
                    fetcher = await self._open()
                got = await fetcher.next()
                if self._closed:
                    raise WALClosed("scanner is closed")
                self._end = fetcher.position - 1
                if not got:
                    self._position = self._end
                    continue
                self._pending, self._taken = got, 0
            # A response is decoded a step at a time (see walsvc.core._budget).
            budget = await turn()
            if self._closed:
                raise WALClosed("scanner is closed")
            start = self._taken
            stop = min(len(got), start + STEP // DECODE_COST)
            out: list[ImmutableMessage] = []
            selected = self._selected
            everything = selected.is_everything
            for offset, head, value in got[start:stop]:
                # The plain data layout (the hot path) without a call; else classify.
                header = head if isinstance(head, bytes) else data_header(offset, head)
                if header is None:  # invalid, a barrier, a filler or a mark
                    continue
                message = decode_split(header, value or b"", KafkaMessageId(offset))
                if everything or selected.admits(message):
                    out.append(message)
            budget.spend((stop - start) * DECODE_COST)
            if stop == len(got):
                self._pending, self._taken = [], 0
                self._position = self._end
            else:
                self._taken = stop
                self._position = got[stop - 1][0]
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
        fetcher, self._fetcher = self._fetcher, None
        if fetcher is not None:
            await fetcher.aclose()
