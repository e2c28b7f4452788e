"""The WAL users hold: a backend, an interceptor chain, and scanners.

The path of an append: ``append`` checks the WAL is writable and the message is a user
message, waits (once) for the interceptors to be ready, then runs the interceptor chain
(concurrent appends together, as one batch: see ``walsvc.write._coalesce``), by the path
``_paths.AppendPaths`` chooses for it.
The chain ends at the serialization point (``walsvc.write._serialization``), which in one
synchronous step allocates the timetick, takes the last-confirmed id, encodes the
envelope and hands it to the backend, whose ``append`` call orders the log: log order
equals timetick order.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Final, final

from scanners._tail_cache import CacheStats, TailCache
from walsvc.backends._base import Backend
from walsvc.backends._subscriptions import SubscriptionScope, check_checkpoint_interval
from walsvc.core._api import ScannerStats
from walsvc.core._chain import (
    PLAIN_BATCH,
    UNCHECKED_BATCH,
    ChainMember,
    ClosingInterceptor,
    KeyRecall,
    ReadyInterceptor,
    StoppingInterceptor,
    TickListener,
    TxnKeyWindow,
    is_plain,
    manages_transactions,
    user_batch_kind,
)
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    InvalidArgument,
    InvalidMessage,
    WALClosed,
    WALReadOnly,
)
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import SYSTEM_TYPES, AppendResult, Message, MessageType, TxnContext
from walsvc.core._metrics import WALMetrics, wal_metrics
from walsvc.core._timetick import TimetickAllocator
from walsvc.read._scanner import LocalScanner, Subscription
from walsvc.read._source import LogSource
from walsvc.write._coalesce import Outcome
from walsvc.write._serialization import SerializationPoint
from walsvc.write._txn import Txn

from ._api import DEFAULT_TXN_BUFFER_BYTES, WAL
from ._context import WALContext
from ._gauges import gauges_of
from ._paths import AppendPaths, admit
from ._startup import WriterStartup
from ._txn_replay import read_committed_txn

__all__ = (
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_TAIL_CACHE_AGE",
    "DEFAULT_TAIL_CACHE_BYTES",
    "DEFAULT_TXN_BUFFER_BYTES",
    "LocalWAL",
)

#: Default largest encoded message, as in Milvus (5 MiB).
DEFAULT_MAX_MESSAGE_SIZE: Final = 5 * 1024 * 1024
#: Default bounds of a writer's tail cache, as Milvus's write-ahead buffer (64 MiB, 30 s).
DEFAULT_TAIL_CACHE_BYTES: Final = 64 * 1024 * 1024
DEFAULT_TAIL_CACHE_AGE: Final = 30.0
_FROM_THE_START: Final = DeliverPolicy.all()


#: The WAL each interceptor instance serves, by the instance's id (an entry goes with its
#: WAL; while the WAL lives it holds the instance, so the id cannot be reused).
_serving: Final[weakref.WeakValueDictionary[int, LocalWAL]] = weakref.WeakValueDictionary()


def check_unbound(members: Sequence[ChainMember]) -> None:
    """Raise ``InvalidArgument`` if an interceptor of ``members`` already serves a WAL, or
    appears twice: an interceptor keeps one WAL's state, so each WAL needs its own."""
    seen: set[int] = set()
    for member in members:
        serving = _serving.get(id(member))
        if serving is not None or id(member) in seen:
            where = "this chain twice" if serving is None else f"WAL {serving.pchannel!r}"
            raise InvalidArgument(
                f"the {type(member).__name__} instance {member!r} already serves {where}: an"
                " interceptor keeps the state of one WAL. Build a chain per WAL"
                " (interceptors.default_chain(), or interceptors=lambda: [...])"
            )
        seen.add(id(member))


@final
class LocalWAL(WAL):
    """A WAL whose writer is in this process: a backend, the interceptor chain, the write
    path and scanners (what ``walsvc.open_wal`` returns for every scheme but ``walsvc://``).

    One pchannel of a write-ahead log, opened with ``walsvc.open_wal``.

    Appends run through the WAL's interceptor chain (by default timetick sync, dedup,
    exclusive DDL, transactions, redo) and return once the message is durable as the
    backend promises, with its id, timetick and last-confirmed id; timeticks strictly
    increase in log order. Reads return scanners. A read-only WAL raises ``WALReadOnly``
    on appends and truncation; every call on a closed WAL raises ``WALClosed``; a fenced
    WAL (a newer writer opened the pchannel) raises ``WALFenced`` on appends.
    """

    __slots__ = (
        "__weakref__",
        "_allocator",
        "_backend",
        "_cache",
        "_closed",
        "_members",
        "_metrics",
        "_newest_at_open",
        "_paths",
        "_point",
        "_scanners",
        "_startup",
        "_tick_listeners",
        "_writable",
    )

    def __init__(
        self,
        backend: Backend,
        *,
        allocator: TimetickAllocator,
        max_message_size: int,
        interceptors: Sequence[ChainMember] = (),
        tail_cache_bytes: int = DEFAULT_TAIL_CACHE_BYTES,
        tail_cache_age: float = DEFAULT_TAIL_CACHE_AGE,
    ) -> None:
        self._backend = backend
        self._allocator = allocator
        self._closed = False
        self._writable = not backend.read_only
        self._scanners: set[LocalScanner] = set()
        self._cache = (
            TailCache(max_bytes=tail_cache_bytes, max_age=tail_cache_age)
            if self._writable
            else None
        )
        point = self._point = SerializationPoint(
            backend, allocator, max_message_size=max_message_size, cache=self._cache
        )
        self._members = tuple(interceptors)
        check_unbound(self._members)
        for member in self._members:
            _serving[id(member)] = self
        self._paths = AppendPaths(self._members, point, backend.immediate_acks)
        #: The newest id in the log when this writer opened (the tail cache's first floor).
        self._newest_at_open: MessageId | None = None
        self._tick_listeners: list[TickListener] = []
        #: Set while the interceptors' ready hooks run, and for good if they failed.
        self._startup: WriterStartup | None = None
        self._metrics = self._record_metrics()

    def _record_metrics(self) -> WALMetrics | None:
        """This WAL's metrics, handed to the parts that count (None while metrics are
        off: ``walsvc.metrics.enable``)."""
        metrics = wal_metrics(self._backend.pchannel, self._backend.scheme)
        if metrics is None:
            return None
        self._point.metrics = metrics
        for coalescer in (self._paths.coalescer, self._paths.keyed_coalescer):
            if coalescer is not None:
                coalescer.metrics = metrics
        if self._writable:
            self._backend.record_into(metrics)
        this = weakref.ref(self)

        def snapshot() -> dict[str, Any] | None:
            wal = this()
            return None if wal is None or wal.closed else gauges_of(wal)

        metrics.snapshot = snapshot
        return metrics

    def _start(self) -> None:
        """For a writer: start the interceptors' ``ready`` hooks in the background."""
        ready = [m for m in self._members if isinstance(m, ReadyInterceptor)]
        if self._writable and ready:
            self._startup = WriterStartup(self._backend, self._point.pins, WALContext(self), ready)

    async def wait_ready(self) -> None:
        """Wait until every interceptor's ``ready`` hook finished (the first append waits
        for this anyway); raises what a hook raised."""
        if self._startup is not None:
            await self._wait_ready()

    async def _wait_ready(self) -> None:
        startup = self._startup
        assert startup is not None
        await startup.wait()  # raises while the start failed: the startup stays
        self._startup = None

    @property
    def pchannel(self) -> str:
        """The physical channel this WAL writes and reads."""
        return self._backend.pchannel

    @property
    def read_only(self) -> bool:
        """True if the WAL was opened read-only."""
        return self._backend.read_only

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called."""
        return self._closed

    @property
    def term(self) -> int:
        """This writer's term (0 when read-only); every message it appends carries it."""
        return self._backend.term

    @property
    def backend(self) -> Backend:
        """The backend underneath (for backend-specific tools and tests)."""
        return self._backend

    @property
    def last_timetick(self) -> int:
        """The newest timetick this writer gave a message (0 before the first): every
        message appended from now on gets a greater one."""
        return self._point.last_tick

    @property
    def last_durable(self) -> tuple[MessageId | None, int]:
        """The id and timetick of the newest message this writer made durable (None
        and -1 before its first)."""
        return self._point.last_acked, self._point.last_acked_tick

    @property
    def scanner_count(self) -> int:
        """How many scanners read this WAL now."""
        return len(self._scanners)

    def subscription_stats(self) -> list[tuple[str, ScannerStats]]:
        """Each open scanner of a durable subscription: its name and ``stats()``."""
        return [
            (name, scanner.stats())
            for scanner in list(self._scanners)  # one C call: safe from a scrape's thread
            if (name := scanner.subscription_name) is not None
        ]

    @property
    def interceptors(self) -> tuple[ChainMember, ...]:
        """The interceptor chain, outermost first (empty when read-only)."""
        return self._members

    def _check_writable(self) -> None:
        if self._writable:
            return
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        if self._backend.read_only:
            raise WALReadOnly(f"WAL {self.pchannel!r} was opened read-only")

    @staticmethod
    def _check_user_message(message: Message) -> None:
        if not isinstance(message, Message):
            raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
        if message.type in SYSTEM_TYPES:
            raise InvalidMessage(
                f"{message.type.name} messages are written by the WAL itself"
                " (transactions: use WAL.begin_txn)"
            )
        if message.txn is not None:
            raise InvalidMessage("transaction messages are appended through WAL.begin_txn")

    # -- appends ----------------------------------------------------------------------

    async def append(self, message: Message) -> AppendResult:
        """Append one message through the interceptor chain; return its id, timetick and
        last-confirmed id once it is durable."""
        if not self._writable:
            self._check_writable()
        if type(message) is not Message or message.type in SYSTEM_TYPES or message.txn is not None:
            self._check_user_message(message)
        if self._startup is not None:
            await self._wait_ready()
        paths = self._paths
        if message.idempotency_key is None:  # and no txn: a plain message
            if paths.coalescer is not None:
                return await paths.coalescer.submit(message)
            admitters = paths.admitters
            if admitters is None or not admit(admitters, message):
                return await paths.plain_chain(message)
            try:  # every member of the plain chain took it: straight to the log
                if paths.immediate_acks:  # (AppendPaths.append_admitted_now, inline)
                    return self._point.serialize_now(message)
                return await self._point.serialize(message)
            finally:
                for member in admitters:
                    member.release_plain(message)
        if paths.keyed_coalescer is not None:
            return await paths.keyed_coalescer.submit(message)
        return await paths.chain(message)

    def submit(self, message: Message) -> asyncio.Future[AppendResult]:
        """Start appending ``message`` as ``append`` would, without a coroutine of the
        caller's: the future gets what ``append`` returns or raises. Cancelling it before
        the message's batch starts leaves the message out of the log, as cancelling
        ``append`` does. For callers that start many appends at once (the node answers
        each remote append from its future's callback)."""
        if self._writable and self._startup is None:
            queued = self._paths.submit(message)
            if queued is not None:
                return queued
        return asyncio.ensure_future(self.append(message))

    def submit_group(self, messages: Sequence[Message]) -> asyncio.Future[list[Outcome]]:
        """Start appending each of ``messages`` as ``append`` would, independently (as
        many producers would: one may fail while the others land, and nothing keeps
        them contiguous); the future gets the list of their outcomes, each a result or
        the error ``append`` would have raised, or raises what all of them raised.
        Cancelling it before their batch starts leaves them all out of the log. Plain
        messages on a backend durable when it appends (``memory://``) are appended
        before this returns, as ``append`` appends each there: no task, no batch."""
        ready = self._writable and self._startup is None
        return self._paths.submit_group(messages, ready, self.submit)

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages in order; return their results once all are durable.

        Messages are validated first: if one is invalid none is appended. When every
        interceptor handles batches (the default chain does, for messages without
        exclusive types; keyed messages included) the batch lands contiguously in the
        log.
        """
        self._check_writable()
        batch = list(messages)
        kind = user_batch_kind(batch)  # in one C loop: checked, and plain or not
        if kind == UNCHECKED_BATCH:
            for message in batch:
                self._check_user_message(message)
            plain = all(map(is_plain, batch))
        else:
            plain = kind == PLAIN_BATCH
        if not batch:
            return []
        if self._startup is not None:
            await self._wait_ready()
        paths = self._paths
        batch_chain = paths.plain_batch_chain if plain else paths.batch_chain
        if batch_chain is not None:
            return await batch_chain(batch)
        chain = paths.plain_chain if plain else paths.chain
        return [await chain(message) for message in batch]

    async def recall_keys(
        self, keys: Sequence[tuple[str, str]], since_tick: int
    ) -> list[AppendResult | None]:
        """What became of keyed appends whose answers were lost, each sent after an
        append with timetick ``since_tick`` was answered: per (vchannel, idempotency
        key) of ``keys``, the result of the message that landed with it, or None if none
        did (``KeyRecall.recall`` of the chain's member that remembers keys: the
        ``Dedup`` window, and the log from ``since_tick`` where the window dropped keys).
        A node calls it before a reconnecting client sends such appends again. Raises
        ``AppendOutcomeUnknown`` if it cannot be told, and ``InvalidArgument`` if no
        member of the chain remembers keys."""
        self._check_writable()
        window = next((m for m in self._members if isinstance(m, KeyRecall)), None)
        if window is None:
            raise InvalidArgument(
                "this WAL's interceptor chain remembers no idempotency keys (interceptors.Dedup)"
            )
        if self._startup is not None:
            await self._wait_ready()
        return await window.recall(keys, since_tick)

    # -- appends of messages the WAL built (transaction control and bodies) ----------

    async def _append_internal(self, message: Message) -> AppendResult:
        """Append a message the WAL built (transaction control and body) through the chain."""
        self._check_writable()
        if self._startup is not None:
            await self._wait_ready()
        return await self._paths.chain(message)

    async def _append_internal_batch(self, messages: list[Message]) -> list[AppendResult]:
        """``_append_internal`` for a batch (transaction bodies): one pass down the batch
        chain when every member handles batches, else one message at a time."""
        self._check_writable()
        if self._startup is not None:
            await self._wait_ready()
        paths = self._paths
        if paths.batch_chain is None:
            return [await paths.chain(message) for message in messages]
        return await paths.batch_chain(messages)

    # -- transactions -----------------------------------------------------------------

    async def begin_txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> Txn:
        """``WAL.begin_txn``: append the BeginTxn of a transaction on ``vchannel`` and
        return its handle (or the replay of a committed one with ``idempotency_key``)."""
        self._check_writable()
        if not any(manages_transactions(m) for m in self._members):
            raise InvalidArgument(
                "this WAL's interceptor chain has no transaction interceptor"
                " (interceptors.Transactions)"
            )
        if type(vchannel) is not str:
            raise InvalidMessage(f"vchannel must be str, not {type(vchannel).__name__}")
        if isinstance(keepalive, bool) or not isinstance(keepalive, int | float):
            raise InvalidArgument(f"keepalive must be a number of seconds, not {keepalive!r}")
        if not 0 < keepalive <= 86_400:
            raise InvalidArgument(f"keepalive must be in (0, 86400] seconds, not {keepalive!r}")
        context = TxnContext(self._allocator.allocate(), max(1, round(keepalive * 1000)))
        begin = Message(payload=b"", vchannel=vchannel, type=MessageType.BEGIN_TXN, txn=context)
        if idempotency_key is not None:
            # The same checks as a keyed message's, before anything is looked up.
            Message(payload=b"", vchannel=vchannel, idempotency_key=idempotency_key)
            window = next((m for m in self._members if isinstance(m, TxnKeyWindow)), None)
            if window is None:
                raise InvalidArgument(
                    "this WAL's interceptor chain remembers no transaction keys"
                    " (interceptors.Dedup)"
                )
            if self._startup is not None:
                await self._wait_ready()
            committed = await window.committed_txn(vchannel, idempotency_key)
            if committed is not None:
                return await self._replay_txn(vchannel, idempotency_key, committed)
        result = await self._append_internal(begin)
        return Txn(
            self._append_internal,
            context,
            vchannel,
            result,
            append_many=self._append_internal_batch,
            idempotency_key=idempotency_key,
        )

    async def _replay_txn(self, vchannel: str, key: str, committed: AppendResult) -> Txn:
        """The handle of a transaction that committed as ``committed`` (a replay)."""

        def read(deliver: DeliverPolicy, filters: Iterable[Filter]) -> LocalScanner:
            return self.read(deliver, filters, raw=True)

        found = await read_committed_txn(read, vchannel, key, committed)
        return Txn(
            self._append_internal,
            found.context,
            vchannel,
            found.begin,
            idempotency_key=key,
            replay=found.replay,
        )

    # -- reads ------------------------------------------------------------------------

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
    ) -> LocalScanner:
        """``WAL.read``: a scanner from ``deliver`` over the messages every filter admits
        (see ``WAL.read`` for what it delivers, ticks and subscriptions)."""
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        if not isinstance(deliver, DeliverPolicy):
            raise TypeError(f"deliver must be a walsvc.DeliverPolicy, not {deliver!r}")
        if type(txn_buffer_bytes) is not int or txn_buffer_bytes < 0:
            raise InvalidArgument(f"txn_buffer_bytes must be an int >= 0, not {txn_buffer_bytes!r}")
        position = deliver.message_id
        if position is not None and not isinstance(position, self._backend.message_id_class):
            raise InvalidArgument(f"{position!r} is not a {self._backend.scheme}:// message id")
        selected = Filter.combine(filters)
        claimed = None
        if subscription is not None:
            check_checkpoint_interval(checkpoint_interval)
            store = self._backend.subscriptions()
            store.claim(subscription)
            claimed = Subscription(
                store, subscription, float(checkpoint_interval), SubscriptionScope.of(selected)
            )
        cache = self._cache if use_cache else None
        if cache is not None:
            acked = self._point.last_acked
            cache.activate(self._newest_at_open if acked is None else acked)

        def open_source(deliver: DeliverPolicy, selected: Filter) -> LogSource:
            return LogSource(self._backend, cache, deliver, selected)

        scanner = LocalScanner(
            open_source,
            self._forget_scanner,
            deliver=deliver,
            selected=selected,
            raw=raw,
            timeticks=timeticks,
            ordered=self._backend.ticks_in_log_order,
            txn_buffer_bytes=txn_buffer_bytes,
            subscription=claimed,
            metrics=self._metrics,
        )
        self._scanners.add(scanner)
        return scanner

    async def delete_subscription(self, name: str) -> None:
        """Forget the durable subscription ``name`` (its checkpoint and scope), so that the
        next scanner of that name starts from its ``deliver`` policy, with its own filter.
        Raises ``SubscriptionBusy`` while a scanner reads it; deleting a name that has no
        checkpoint does nothing."""
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        store = self._backend.subscriptions()
        store.claim(name)
        try:
            await store.delete(name)
        finally:
            store.release(name)

    def _forget_scanner(self, scanner: LocalScanner) -> None:
        self._scanners.discard(scanner)
        if not self._scanners and self._cache is not None:
            self._cache.deactivate()

    def cache_stats(self) -> CacheStats | None:
        """A snapshot of the tail cache (None on a read-only WAL, which has none)."""
        return None if self._cache is None else self._cache.stats()

    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended (even if since truncated),
        or None if nothing was ever appended."""
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        return await self._backend.latest_message_id()

    async def truncate(self, message_id: MessageId) -> None:
        """Drop every message up to and including ``message_id``."""
        self._check_writable()
        await self._backend.truncate(message_id)
        if self._cache is not None:
            self._cache.truncated(message_id)

    async def aclose(self) -> None:
        """Stop the interceptors, finish queued appends, close the scanners (their reads
        raise ``WALClosed``) and the backend; an error is raised once all ran. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writable = False
        # From here the appends still draining (queued, or owned by Dedup) are bounded
        # by the backend's close timeout, not its request timeouts.
        self._backend.begin_close()
        if self._startup is not None:
            await self._startup.cancel()
        for member in self._members:  # what queued appends wait for stops first
            if isinstance(member, StoppingInterceptor):
                member.begin_close()
        for coalescer in (self._paths.coalescer, self._paths.keyed_coalescer):
            if coalescer is not None:
                await coalescer.drain()
        errors: list[BaseException] = []
        for member in reversed(self._members):
            if isinstance(member, ClosingInterceptor):
                try:
                    await member.aclose()
                except Exception as exc:
                    errors.append(exc)
        # Together: a scanner's close may wait for its reader (Pulsar: a pop, up to 200
        # ms); one that fails stops neither the others nor the backend's close.
        scanners, self._scanners = self._scanners, set()
        closing = (scanner._close_for_wal() for scanner in scanners)
        closed = await asyncio.gather(*closing, return_exceptions=True)
        errors += [outcome for outcome in closed if isinstance(outcome, BaseException)]
        if self._cache is not None:
            self._cache.deactivate()
            self._cache.wake()
        await self._backend.aclose()
        if errors:
            raise errors[0]

    def __repr__(self) -> str:
        mode = "ro" if self.read_only else f"rw term={self.term}"
        state = " closed" if self._closed else ""
        return f"<walsvc.WAL {self._backend.scheme}:{self.pchannel} {mode}{state}>"
