"""The scanner users iterate: messages of one pchannel in log order, filtered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import final

from ._errors import WALClosed
from ._message import ImmutableMessage
from .backends import BackendScanner

__all__ = ("Scanner",)


@final
class Scanner:
    """Messages in log order, as an async iterator and async context manager.

    Iteration waits for new messages at the end of the log; it ends only when this scanner
    is closed with ``aclose()``. If the WAL is closed underneath it, iteration raises
    ``WALClosed`` instead, so a reader never mistakes a shutdown for the end of the log.
    """

    __slots__ = ("_backend_scanner", "_batch", "_index", "_on_close", "_user_closed")

    def __init__(
        self, backend_scanner: BackendScanner, on_close: Callable[[Scanner], None]
    ) -> None:
        self._backend_scanner = backend_scanner
        self._on_close = on_close
        self._batch: Sequence[ImmutableMessage] = ()
        self._index = 0
        self._user_closed = False

    def __aiter__(self) -> Scanner:
        return self

    async def __anext__(self) -> ImmutableMessage:
        index = self._index
        batch = self._batch
        if index < len(batch):
            self._index = index + 1
            return batch[index]
        batch = await self._next_batch()
        self._batch = batch
        self._index = 1
        return batch[0]

    async def batches(self) -> AsyncIterator[Sequence[ImmutableMessage]]:
        """Iterate in batches (each non-empty) instead of one message at a time."""
        if self._index < len(self._batch):
            rest = self._batch[self._index :]
            self._batch, self._index = (), 0
            yield rest
        while True:
            try:
                yield await self._next_batch()
            except StopAsyncIteration:
                return

    async def _next_batch(self) -> Sequence[ImmutableMessage]:
        if self._user_closed:
            raise StopAsyncIteration
        try:
            return await self._backend_scanner.next_batch()
        except WALClosed:
            if self._user_closed:
                raise StopAsyncIteration from None
            raise

    async def aclose(self) -> None:
        """Stop the scanner; iteration then ends. Idempotent."""
        if self._user_closed:
            return
        self._user_closed = True
        self._batch, self._index = (), 0  # nothing buffered is delivered after close
        self._on_close(self)
        await self._backend_scanner.aclose()

    async def _close_for_wal(self) -> None:
        """Close because the WAL closed: pending and later reads raise ``WALClosed``."""
        self._batch, self._index = (), 0
        await self._backend_scanner.aclose()

    async def __aenter__(self) -> Scanner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
