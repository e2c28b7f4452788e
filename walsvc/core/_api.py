"""The scanner API as an abstract class: what a reader holds, whether the scanner reads
in this process (``walsvc.read``) or is fed by a node over the network (``walsvc.remote``).

``walsvc.Scanner`` is this class, so ``isinstance`` holds for both kinds. (The WAL's
abstract class is ``walsvc.wal._api.WAL``: its ``begin_txn`` returns a ``Txn``, which
lives in the write path above this layer.)
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Literal

import msgspec

from ._deliver import Checkpoint
from ._ids import MessageId
from ._message import ImmutableMessage

__all__ = ("Scanner", "ScannerStats")


class ScannerStats(msgspec.Struct, frozen=True):
    """A snapshot of one scanner: where it reads (``"cache"``, ``"backend"``; over
    walsvc:// the node's scanner's, or ``"node"`` from a node that speaks only protocol
    version 1) and how far it got, what it delivered, its hand-offs between the tail
    cache and the backend, what its reorder and transaction stages hold or rejected,
    and its subscription's last durable checkpoint."""

    source: Literal["cache", "backend", "node", "not started"]
    position: MessageId | None
    delivered: int
    handoffs: int
    fallbacks: int
    rejected: int
    held_for_order: int
    open_txns: int
    txn_bytes: int
    checkpoint: Checkpoint | None


class Scanner(abc.ABC):
    """Messages of one pchannel, as an async iterator and async context manager.

    Iteration waits for new messages at the end of the log; it ends only when this scanner
    is closed with ``aclose()``. If the WAL is closed underneath it, iteration raises
    ``WALClosed`` instead, so a reader never mistakes a shutdown for the end of the log.
    Unless read ``raw``, messages come in timetick order, a transaction appears only
    once committed, as one ``MessageType.TXN`` message, and the WAL's own TimeTicks are
    left out unless asked for (``timeticks``).
    """

    # The batch being handed out one message at a time, and the next message's index.
    __slots__ = ("_batch", "_index")

    def __init__(self) -> None:
        self._batch: Sequence[ImmutableMessage] = ()
        self._index = 0

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

    async def batches(self) -> AsyncGenerator[Sequence[ImmutableMessage], None]:
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

    @abc.abstractmethod
    async def _next_batch(self) -> Sequence[ImmutableMessage]:
        """The next non-empty batch, waiting for one; raises ``StopAsyncIteration`` once
        the scanner is closed (and what a read raises)."""

    @abc.abstractmethod
    async def ack(self, message: ImmutableMessage) -> None:
        """Acknowledge ``message`` (and everything delivered before it): the subscription
        resumes after it. Checkpoint writes are forward-only and throttled; ``aclose``
        flushes the last one. Raises ``InvalidArgument`` without a subscription, and the
        error of a failed checkpoint write."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Write the subscription's latest acknowledged checkpoint now."""

    @abc.abstractmethod
    def stats(self) -> ScannerStats:
        """A snapshot of this scanner (see ``ScannerStats``)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop the scanner (iteration then ends) and flush its subscription's checkpoint.
        Idempotent."""

    async def __aenter__(self) -> Scanner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
