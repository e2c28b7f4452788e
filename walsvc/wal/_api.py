"""The WAL API as an abstract class: what a user holds, whether the log's writer is in
this process (``walsvc.wal._wal.LocalWAL``) or is a walsvc node reached over the network
(``walsvc.remote``).

``walsvc.WAL`` is this class, so ``isinstance`` holds for both kinds and a function typed
with it takes either. Shared behaviour (context managers, ``txn`` built on
``begin_txn``) lives here once.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Final, Self

from walsvc.core._api import Scanner
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, Message
from walsvc.write._txn import Txn

__all__ = ("DEFAULT_TXN_BUFFER_BYTES", "WAL")

#: Default bound on the transaction bodies one scanner holds until their commit.
DEFAULT_TXN_BUFFER_BYTES: Final = 64 * 1024 * 1024
_FROM_THE_START: Final = DeliverPolicy.all()


class WAL(abc.ABC):
    """One pchannel of a write-ahead log, opened with ``walsvc.open_wal``.

    Appends run through the interceptor chain of the WAL's writer (by default timetick
    sync, dedup, exclusive DDL, transactions, redo) and return once the message is durable
    as the backend promises, with its id, timetick and last-confirmed id; timeticks
    strictly increase in log order. Reads return scanners. A read-only WAL raises
    ``WALReadOnly`` on appends and truncation; every call on a closed WAL raises
    ``WALClosed``; a fenced WAL (a newer writer opened the pchannel) raises ``WALFenced``
    on appends. The writer is in this process for ``memory://``, ``file://``, ``kafka://``
    and ``pulsar://`` URLs, and in a walsvc node for ``walsvc://`` ones.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def pchannel(self) -> str:
        """The physical channel this WAL writes and reads."""

    @property
    @abc.abstractmethod
    def read_only(self) -> bool:
        """True if the WAL was opened read-only."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once ``aclose`` was called."""

    @property
    @abc.abstractmethod
    def term(self) -> int:
        """The writer's term (0 when read-only); every message it appends carries it."""

    @abc.abstractmethod
    async def wait_ready(self) -> None:
        """Wait until the writer's interceptors are ready (the first append waits for
        this anyway); raises what their start raised."""

    @abc.abstractmethod
    async def append(self, message: Message) -> AppendResult:
        """Append one message through the interceptor chain; return its id, timetick and
        last-confirmed id once it is durable."""

    @abc.abstractmethod
    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages in order; return their results once all are durable.

        Messages are validated first: if one is invalid none is appended. When every
        interceptor handles batches (the default chain does, for messages without
        idempotency keys or exclusive types) the batch lands contiguously in the log.
        """

    @abc.abstractmethod
    async def begin_txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> Txn:
        """Open a transaction on ``vchannel``: append its BeginTxn and return the handle.

        ``keepalive`` (seconds) is how long the transaction may go without a body append
        before the WAL rolls it back; it is measured in timeticks. Needs a transaction
        interceptor in the chain (the default chain has one).

        ``idempotency_key`` makes the transaction exactly-once, as a key does a message:
        its CommitTxn carries the key, and if a transaction with that key on ``vchannel``
        committed (within the dedup window, across restarts too), this returns a replay
        (``Txn.replayed``) that appends nothing and answers with that run's results. A
        commit in flight with the key is waited for. Needs ``interceptors.Dedup`` in the
        chain (the default chain has it).
        """

    @asynccontextmanager
    async def txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> AsyncIterator[Txn]:
        """``async with wal.txn(vchannel) as txn:`` begins a transaction, commits it when
        the block succeeds and rolls it back when the block raises. ``idempotency_key``:
        see ``begin_txn``."""
        handle = await self.begin_txn(
            vchannel, keepalive=keepalive, idempotency_key=idempotency_key
        )
        async with handle:
            yield handle

    @abc.abstractmethod
    def read(
        self,
        deliver: DeliverPolicy = _FROM_THE_START,
        filters: Iterable[Filter] = (),
        *,
        raw: bool = False,
        timeticks: bool = False,
        use_cache: bool = True,
        subscription: str | None = None,
        txn_buffer_bytes: int = DEFAULT_TXN_BUFFER_BYTES,
        checkpoint_interval: float = 1.0,
    ) -> Scanner:
        """A scanner from ``deliver`` over the messages every filter admits.

        Messages come in timetick order; a transaction is delivered once committed, as
        one ``MessageType.TXN`` message whose ``body`` holds its messages (its open
        bodies are held, up to ``txn_buffer_bytes`` per scanner, else ``TxnBufferFull``).
        ``raw=True`` delivers the log exactly as stored instead (transaction control and
        bodies included). On a writer, scanners read the tail cache when it holds what
        they need next (``use_cache=False``: always the backend).

        The WAL's own TimeTicks (``MessageType.TIME_TICK``: one at each open, then one
        after each burst of appends, and while a scanner waits at the end of the log the
        unpersisted idle ticks of the timetick sync, ``persisted=False``) are left out
        unless ``timeticks=True`` (or ``raw=True``). Filters never drop them: a tick
        passes every filter, so a reader of a quiet vchannel that asks for them still
        sees time move.

        ``subscription="name"`` makes the scanner resume after the last message
        acknowledged with ``await scanner.ack(message)`` by an earlier scanner of that
        name (``deliver`` applies only when the subscription has no checkpoint yet, and is
        resolved at the first read, when the checkpoint is loaded). Its
        checkpoint is stored with the log, written at most every ``checkpoint_interval``
        seconds and on ``aclose``; a reader that dies between two writes gets again the
        messages after the last written checkpoint. While every delivered message is
        acknowledged, the TimeTicks left out move the checkpoint on, so a subscription on
        a quiet vchannel does not fall behind the log. One scanner per name at a time
        (``SubscriptionBusy``). A subscription is a position among the messages of its
        filter: it keeps the vchannels and types it was first read with, and a scanner
        that asks for other ones gets ``SubscriptionMismatch`` at its first read (use
        another name, or ``delete_subscription`` first).
        """

    @abc.abstractmethod
    async def delete_subscription(self, name: str) -> None:
        """Forget the durable subscription ``name`` (its checkpoint and scope), so that the
        next scanner of that name starts from its ``deliver`` policy, with its own filter.
        Raises ``SubscriptionBusy`` while a scanner reads it; deleting a name that has no
        checkpoint does nothing."""

    @abc.abstractmethod
    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended (even if since truncated),
        or None if nothing was ever appended."""

    @abc.abstractmethod
    async def truncate(self, message_id: MessageId) -> None:
        """Drop every message up to and including ``message_id``."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop the interceptors, finish queued appends, close every scanner (their reads
        raise ``WALClosed``) and release the backend. Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
