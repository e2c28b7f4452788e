"""The WAL users hold: a backend, an interceptor chain, and scanners.

The path of an append: ``append`` checks the WAL is writable and the message is a user
message, waits (once) for the interceptors to be ready, then runs the interceptor chain
(concurrent plain appends together, as one batch: see ``walsvc._coalesce``).
The chain ends at the serialization point (``_serialize``), which in one synchronous step
allocates the timetick, takes the last-confirmed id, encodes the envelope and hands it to
the backend, whose ``append`` call orders the log. Log order therefore equals timetick
order (the invariant is enforced here, by doing those things with no ``await`` between
them).
"""

from __future__ import annotations

import asyncio
import itertools
import types
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Final, final

from scanners._tail_cache import CacheStats, TailCache

from ._chain import (
    AppendNext,
    ChainMember,
    ClosingInterceptor,
    PlainAdmission,
    ReadyInterceptor,
    TickListener,
    build_batch_chain,
    build_chain,
    is_plain,
    plain_admitters,
)
from ._coalesce import AppendCoalescer
from ._codec import (
    HEADER_SIZE,
    are_plain,
    encode,
    encode_plain,
    encode_plain_many,
    encode_plain_message,
    last_confirmed_ext,
)
from ._context import WALContext
from ._deliver import DeliverPolicy
from ._errors import (
    AppendOutcomeUnknown,
    InvalidArgument,
    InvalidMessage,
    MessageTooLarge,
    WALClosed,
    WALError,
    WALReadOnly,
    WALTruncated,
)
from ._filter import Filter
from ._ids import MessageId
from ._message import (
    NO_PROPERTIES,
    SYSTEM_TYPES,
    AppendResult,
    ImmutableMessage,
    Message,
    MessageType,
    TxnContext,
)
from ._scanner import Scanner, Subscription
from ._source import LogSource
from ._timetick import TimetickAllocator
from ._txn import Txn
from .backends import Backend

__all__ = (
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_TAIL_CACHE_AGE",
    "DEFAULT_TAIL_CACHE_BYTES",
    "DEFAULT_TXN_BUFFER_BYTES",
    "WAL",
)

#: Default largest encoded message, as in Milvus (5 MiB).
DEFAULT_MAX_MESSAGE_SIZE: Final = 5 * 1024 * 1024
#: Default bounds of a writer's tail cache, as Milvus's write-ahead buffer (64 MiB, 30 s).
DEFAULT_TAIL_CACHE_BYTES: Final = 64 * 1024 * 1024
DEFAULT_TAIL_CACHE_AGE: Final = 30.0
#: Default bound on the transaction bodies one scanner holds until their commit.
DEFAULT_TXN_BUFFER_BYTES: Final = 64 * 1024 * 1024
_FROM_THE_START: Final = DeliverPolicy.all()
#: Envelopes carry a last-confirmed id refreshed once this many ticks passed since the
#: last refresh: at least every millisecond of the hybrid clock, and every 256 appends.
_CONFIRM_STEP: Final = 255
#: The last-confirmed pin held while a writer's interceptors recover (_hold_recovered_checkpoint).
_RECOVERY: Final = object()


@final
class WAL:
    """One pchannel of a write-ahead log, opened with ``walsvc.open_wal``.

    Appends run through the WAL's interceptor chain (by default timetick sync, dedup,
    exclusive DDL, transactions, redo) and return once the message is durable as the
    backend promises, with its id, timetick and last-confirmed id; timeticks strictly
    increase in log order. Reads return scanners. A read-only WAL raises ``WALReadOnly``
    on appends and truncation; every call on a closed WAL raises ``WALClosed``; a fenced
    WAL (a newer writer opened the pchannel) raises ``WALFenced`` on appends.
    """

    __slots__ = (
        "_allocator",
        "_backend",
        "_batch_chain",
        "_cache",
        "_chain",
        "_closed",
        "_coalescer",
        "_confirmed",
        "_confirmed_tick",
        "_data_tick",
        "_ext",
        "_ext_id",
        "_immediate_acks",
        "_last_acked",
        "_last_acked_tick",
        "_last_tick",
        "_max_message_size",
        "_max_payload",
        "_members",
        "_newest_at_open",
        "_pins",
        "_plain_admitters",
        "_plain_batch_chain",
        "_plain_chain",
        "_ready",
        "_ready_error",
        "_scanners",
        "_term",
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
        self._max_message_size = max_message_size
        self._max_payload = max_message_size - HEADER_SIZE
        self._closed = False
        self._writable = not backend.read_only
        self._term = backend.term
        self._scanners: set[Scanner] = set()
        self._members = tuple(interceptors)
        self._chain: AppendNext = build_chain(self._members, self._serialize)
        self._batch_chain = build_batch_chain(self._members, self._serialize_batch)
        # Plain messages (no idempotency key, no txn: most appends) skip the members that
        # declare they pass them through.
        self._plain_chain = build_chain(self._members, self._serialize, plain=True)
        self._plain_batch_chain = build_batch_chain(
            self._members, self._serialize_batch, plain=True
        )
        # A plain message appended on its own skips the chain when every member of it
        # admits the message synchronously (see PlainAdmission): no coroutine per member.
        self._plain_admitters = plain_admitters(self._members)
        self._immediate_acks = backend.immediate_acks
        # Concurrent plain appends share one pass down the batch chain when every member
        # handles batches and the backend's acks take time (else there is no concurrency
        # to exploit, and a batch would only add a loop iteration to each append).
        self._coalescer = (
            AppendCoalescer(self._plain_batch_chain, self._plain_chain)
            if self._plain_batch_chain is not None and not backend.immediate_acks
            else None
        )
        self._last_acked: MessageId | None = None
        self._last_acked_tick = -1  # the timetick of _last_acked
        #: The newest id in the log when this writer opened (the tail cache's first floor).
        self._newest_at_open: MessageId | None = None
        self._confirmed: MessageId | None = None
        self._confirmed_tick = 0
        self._ext_id: MessageId | None = None  # the last-confirmed id _ext encodes
        self._ext = b""
        self._pins: dict[object, MessageId | None] = {}
        self._last_tick = 0
        self._data_tick = 0
        self._tick_listeners: list[TickListener] = []
        self._cache = (
            TailCache(max_bytes=tail_cache_bytes, max_age=tail_cache_age)
            if self._writable
            else None
        )
        self._ready: asyncio.Task[None] | None = None
        self._ready_error: BaseException | None = None

    def _start(self) -> None:
        """For a writer: start the interceptors' ``ready`` hooks in the background."""
        ready = [m for m in self._members if isinstance(m, ReadyInterceptor)]
        if self._writable and ready:
            self._ready = asyncio.get_running_loop().create_task(self._run_ready(ready))

    async def _run_ready(self, members: list[ReadyInterceptor]) -> None:
        await self._hold_recovered_checkpoint()
        context = WALContext(self)
        for member in members:
            await member.ready(context)
        self._pins.pop(_RECOVERY, None)

    async def _hold_recovered_checkpoint(self) -> None:
        """Before the ready hooks run: until they finish, new messages (the opening
        TimeTick, rollbacks of orphaned transactions) carry the last-confirmed id of the
        newest message in the log, so a transaction an earlier writer left open stays
        visible from every checkpoint written meanwhile."""
        latest = await self._backend.latest_message_id()
        if latest is None:
            return
        scanner = self._backend.read(DeliverPolicy.start_from(latest), Filter.everything())
        try:
            (newest, *_) = await scanner.next_batch()
        except WALTruncated:
            return  # nothing retained: nothing left open
        finally:
            await scanner.aclose()
        self._pins[_RECOVERY] = newest.last_confirmed_id

    async def wait_ready(self) -> None:
        """Wait until every interceptor's ``ready`` hook finished (the first append waits
        for this anyway); raises what a hook raised."""
        if self._ready is not None or self._ready_error is not None:
            await self._wait_ready()

    async def _wait_ready(self) -> None:
        ready = self._ready
        assert ready is not None
        if not ready.done():
            await asyncio.shield(ready)
        self._ready = None
        exc = ready.exception()
        if exc is not None:
            self._ready_error = exc
        if self._ready_error is not None:
            raise self._ready_error

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

    # -- the serialization point ------------------------------------------------------

    def _encode(self, message: Message) -> tuple[bytes, int, MessageId | None]:
        payload = message.payload
        if len(payload) > self._max_payload:
            raise MessageTooLarge(
                f"message payload of {len(payload)} bytes exceeds max_message_size"
                f" {self._max_message_size}"
            )
        tick = self._allocator.allocate()
        if self._pins:
            last_confirmed = next(iter(self._pins.values()))
        else:
            # A slightly older last-confirmed id is as good a resume point (readers skip
            # by timetick), and one shared by a run of appends is encoded once.
            if tick - self._confirmed_tick > _CONFIRM_STEP or self._confirmed is None:
                self._confirmed = self._last_acked
                self._confirmed_tick = tick
            last_confirmed = self._confirmed
        if message.properties or message.idempotency_key is not None or message.txn:
            record = encode(message, timetick=tick, term=self._term, last_confirmed=last_confirmed)
        else:  # the common message: one call; the ext section is encoded once per id
            if last_confirmed is not self._ext_id:
                self._ext_id = last_confirmed
                self._ext = b"" if last_confirmed is None else last_confirmed_ext(last_confirmed)
            plain = encode_plain_message(
                message, tick, self._term, self._ext, self._max_message_size
            )
            if plain is not None:
                self._last_tick = self._data_tick = tick
                return plain, tick, last_confirmed
            record = encode_plain(  # too large: the check below says by how much
                message.type, message.vchannel, payload, tick, self._term, self._ext
            )
        if len(record) > self._max_message_size:
            raise MessageTooLarge(
                f"encoded message of {len(record)} bytes exceeds max_message_size"
                f" {self._max_message_size}"
            )
        self._last_tick = self._data_tick = tick
        return record, tick, last_confirmed

    async def _serialize(self, message: Message) -> AppendResult:
        """The innermost step of every chain: tick, last-confirmed id, envelope, backend,
        and (once acknowledged) the tail cache."""
        record, tick, last_confirmed = self._encode(message)
        # Nothing may await between _encode (which allocates the tick) and the backend
        # call (the serialization point): that keeps log order equal to tick order.
        cache = self._cache
        try:
            acked = self._backend.append((record,))
        except WALError:
            raise
        except Exception as exc:
            raise self._outcome_unknown(exc) from exc
        slot = cache.reserve(1) if cache is not None else -1
        try:
            ids = await acked
        except BaseException as exc:
            if cache is not None:
                cache.lose(slot, 1)
            if isinstance(exc, Exception) and not isinstance(exc, WALError):
                raise self._outcome_unknown(exc) from exc
            raise
        return self._acknowledged(message, ids[0], tick, last_confirmed, slot)

    def _serialize_now(self, message: Message) -> AppendResult:
        """``_serialize`` on a backend whose appends are durable when made
        (``Backend.append_now``): the same steps, without an ``await``."""
        record, tick, last_confirmed = self._encode(message)
        try:
            ids = self._backend.append_now((record,))
        except WALError:
            raise
        except Exception as exc:
            raise self._outcome_unknown(exc) from exc
        cache = self._cache
        slot = cache.reserve(1) if cache is not None else -1
        return self._acknowledged(message, ids[0], tick, last_confirmed, slot)

    def _acknowledged(
        self,
        message: Message,
        message_id: MessageId,
        tick: int,
        last_confirmed: MessageId | None,
        slot: int,
    ) -> AppendResult:
        """Record that the backend acknowledged ``message`` as ``message_id``; fill its
        tail-cache ``slot`` (-1: none reserved, the cache is off)."""
        self._last_acked = message_id
        self._last_acked_tick = tick
        cache = self._cache
        if slot >= 0:
            assert cache is not None
            cache.put(slot, (self._cached(message, message_id, tick, last_confirmed),))
        elif cache is not None:
            cache.acked(1)
        return AppendResult(message_id, tick, last_confirmed)

    def _encode_batch(
        self, messages: Sequence[Message]
    ) -> tuple[list[bytes], Sequence[int], Iterable[MessageId | None]]:
        """``_encode`` for a batch: the records, their ticks and their last-confirmed ids.
        Consecutive ticks from one allocator call, one last-confirmed id and ext section
        and one call of the (compiled) batch encoder when no message has properties, a
        key or a txn; else message by message."""
        allocate_many = getattr(self._allocator, "allocate_many", None)
        batch = messages if type(messages) is list else list(messages)
        if allocate_many is None or not are_plain(batch, self._max_payload):
            max_payload = self._max_payload
            for message in batch:  # a payload too large fails the batch before any tick
                if len(message.payload) > max_payload:
                    self._encode(message)  # raises MessageTooLarge, saying so
            encoded = [self._encode(m) for m in batch]
            return [e[0] for e in encoded], [e[1] for e in encoded], [e[2] for e in encoded]
        count = len(batch)
        first: int = allocate_many(count)
        # The choice of last-confirmed id and ext is _encode's, once per batch here
        # (_encode keeps it inline: it runs once per single append).
        if self._pins:
            last_confirmed = next(iter(self._pins.values()))
        else:
            if first - self._confirmed_tick > _CONFIRM_STEP or self._confirmed is None:
                self._confirmed = self._last_acked
                self._confirmed_tick = first
            last_confirmed = self._confirmed
        if last_confirmed is not self._ext_id:
            self._ext_id = last_confirmed
            self._ext = b"" if last_confirmed is None else last_confirmed_ext(last_confirmed)
        limit = self._max_message_size
        records = encode_plain_many(batch, first, self._term, self._ext, limit)
        if records is None:
            for tick, message in enumerate(batch, first):
                size = len(
                    encode_plain(
                        message.type, message.vchannel, message.payload, tick, self._term, self._ext
                    )
                )
                if size > limit:
                    raise MessageTooLarge(
                        f"encoded message of {size} bytes exceeds max_message_size {limit}"
                    )
        assert records is not None
        self._last_tick = self._data_tick = first + count - 1
        return records, range(first, first + count), itertools.repeat(last_confirmed, count)

    async def _serialize_batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        """``_serialize`` for a batch: contiguous in the log, one backend call."""
        records, ticks, confirmed = self._encode_batch(messages)
        if not records:
            return []
        count = len(records)
        cache = self._cache
        try:
            acked = self._backend.append(records)
        except WALError:
            raise
        except Exception as exc:
            raise self._outcome_unknown(exc) from exc
        slot = cache.reserve(count) if cache is not None else -1
        try:
            ids = await acked
        except BaseException as exc:
            if cache is not None:
                cache.lose(slot, count)
            if isinstance(exc, Exception) and not isinstance(exc, WALError):
                raise self._outcome_unknown(exc) from exc
            raise
        self._last_acked = ids[-1]
        self._last_acked_tick = ticks[-1]
        if len(ids) != count:
            raise self._outcome_unknown(
                RuntimeError(f"the backend acknowledged {len(ids)} of {count} records")
            )
        results = list(map(AppendResult, ids, ticks, confirmed))
        if slot >= 0:
            assert cache is not None
            cache.put(
                slot,
                [
                    self._cached(m, r.message_id, r.timetick, r.last_confirmed_id)
                    for m, r in zip(messages, results, strict=True)
                ],
            )
        elif cache is not None:
            cache.acked(count)
        return results

    def _cached(
        self, message: Message, message_id: MessageId, tick: int, last_confirmed: MessageId | None
    ) -> ImmutableMessage:
        """The message as the log returns it, built from what the writer already has."""
        properties = message.properties
        return ImmutableMessage(
            message_id,
            tick,
            message.vchannel,
            message.type,
            message.payload,
            types.MappingProxyType(dict(properties)) if properties else NO_PROPERTIES,
            last_confirmed,
            message.txn,
            message.idempotency_key,
            self._term,
        )

    def _outcome_unknown(self, exc: Exception) -> AppendOutcomeUnknown:
        return AppendOutcomeUnknown(
            f"appending to {self.pchannel!r} failed after the record(s) were handed to the"
            f" backend ({exc!r}); they may or may not be in the log"
        )

    # -- appends ----------------------------------------------------------------------

    async def append(self, message: Message) -> AppendResult:
        """Append one message through the interceptor chain; return its id, timetick and
        last-confirmed id once it is durable."""
        if not self._writable:
            self._check_writable()
        if type(message) is not Message or message.type in SYSTEM_TYPES or message.txn is not None:
            self._check_user_message(message)
        if self._ready is not None or self._ready_error is not None:
            await self._wait_ready()
        if message.idempotency_key is None:  # and no txn: a plain message
            if self._coalescer is not None:
                return await self._coalescer.submit(message)
            admitters = self._plain_admitters
            if admitters is None or not _admit(admitters, message):
                return await self._plain_chain(message)
            try:  # every member of the plain chain took it: straight to the log
                if self._immediate_acks:
                    return self._serialize_now(message)
                return await self._serialize(message)
            finally:
                for member in admitters:
                    member.release_plain(message)
        return await self._chain(message)

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages in order; return their results once all are durable.

        Messages are validated first: if one is invalid none is appended. When every
        interceptor handles batches (the default chain does, for messages without
        idempotency keys or exclusive types) the batch lands contiguously in the log.
        """
        self._check_writable()
        batch = list(messages)
        for message in batch:
            self._check_user_message(message)
        if not batch:
            return []
        if self._ready is not None or self._ready_error is not None:
            await self._wait_ready()
        plain = all(map(is_plain, batch))
        batch_chain = self._plain_batch_chain if plain else self._batch_chain
        if batch_chain is not None:
            return await batch_chain(batch)
        chain = self._plain_chain if plain else self._chain
        return [await chain(message) for message in batch]

    async def _append_internal(self, message: Message) -> AppendResult:
        """Append a message the WAL built (transaction control and body) through the chain."""
        self._check_writable()
        if self._ready is not None or self._ready_error is not None:
            await self._wait_ready()
        return await self._chain(message)

    # -- transactions -----------------------------------------------------------------

    async def begin_txn(self, vchannel: str, *, keepalive: float = 10.0) -> Txn:
        """Open a transaction on ``vchannel``: append its BeginTxn and return the handle.

        ``keepalive`` (seconds) is how long the transaction may go without a body append
        before the WAL rolls it back; it is measured in timeticks. Needs a transaction
        interceptor in the chain (the default chain has one).
        """
        self._check_writable()
        if not any(getattr(m, "manages_transactions", False) for m in self._members):
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
        result = await self._append_internal(begin)
        return Txn(self._append_internal, context, vchannel, result)

    @asynccontextmanager
    async def txn(self, vchannel: str, *, keepalive: float = 10.0) -> AsyncIterator[Txn]:
        """``async with wal.txn(vchannel) as txn:`` begins a transaction, commits it when
        the block succeeds and rolls it back when the block raises."""
        handle = await self.begin_txn(vchannel, keepalive=keepalive)
        async with handle:
            yield handle

    # -- reads ------------------------------------------------------------------------

    def read(
        self,
        deliver: DeliverPolicy = _FROM_THE_START,
        filters: Iterable[Filter] = (),
        *,
        raw: bool = False,
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
        they need next (``use_cache=False``: always the backend), and a scanner that has
        caught up also receives the idle TimeTicks of the timetick sync
        (``persisted=False``; not with ``use_cache=False``).

        ``subscription="name"`` makes the scanner resume after the last message
        acknowledged with ``await scanner.ack(message)`` by an earlier scanner of that
        name (``deliver`` applies only when the subscription has no checkpoint yet). Its
        checkpoint is stored with the log, written at most every ``checkpoint_interval``
        seconds and on ``aclose``; a reader that dies between two writes gets again the
        messages after the last written checkpoint. One scanner per name at a time
        (``SubscriptionBusy``).
        """
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
            if (
                isinstance(checkpoint_interval, bool)
                or not isinstance(checkpoint_interval, int | float)
                or not 0 <= checkpoint_interval <= 3600
            ):
                raise InvalidArgument(
                    f"checkpoint_interval must be in [0, 3600] seconds, not {checkpoint_interval!r}"
                )
            store = self._backend.subscriptions()
            store.claim(subscription)
            claimed = Subscription(store, subscription, float(checkpoint_interval))
        cache = self._cache if use_cache else None
        if cache is not None:
            acked = self._last_acked
            cache.activate(self._newest_at_open if acked is None else acked)

        def open_source(deliver: DeliverPolicy, selected: Filter) -> LogSource:
            return LogSource(self._backend, cache, deliver, selected)

        scanner = Scanner(
            open_source,
            self._forget_scanner,
            deliver=deliver,
            selected=selected,
            raw=raw,
            ordered=self._backend.ticks_in_log_order,
            txn_buffer_bytes=txn_buffer_bytes,
            subscription=claimed,
        )
        self._scanners.add(scanner)
        return scanner

    def _forget_scanner(self, scanner: Scanner) -> None:
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
        """Stop the interceptors, finish queued appends, close every scanner (their reads
        raise ``WALClosed``) and release the backend. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writable = False
        ready = self._ready
        if ready is not None:
            # A failed ready hook (e.g. the writer was fenced before its first TimeTick)
            # that no append ever waited for: its error is retrieved here, not leaked.
            ready.cancel()
            await asyncio.gather(ready, return_exceptions=True)
        if self._coalescer is not None:
            await self._coalescer.drain()
        errors: list[BaseException] = []
        for member in reversed(self._members):
            if isinstance(member, ClosingInterceptor):
                try:
                    await member.aclose()
                except Exception as exc:
                    errors.append(exc)
        scanners, self._scanners = self._scanners, set()
        for scanner in scanners:
            await scanner._close_for_wal()
        if self._cache is not None:
            self._cache.deactivate()
            self._cache.wake()
        await self._backend.aclose()
        if errors:
            raise errors[0]

    async def __aenter__(self) -> WAL:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        mode = "ro" if self.read_only else f"rw term={self.term}"
        state = " closed" if self._closed else ""
        return f"<walsvc.WAL {self._backend.scheme}:{self.pchannel} {mode}{state}>"


def _admit(admitters: tuple[PlainAdmission, ...], message: Message) -> bool:
    """Whether every one of ``admitters`` took ``message`` (``PlainAdmission``); if one
    refuses, those that took it release it."""
    for taken, member in enumerate(admitters):
        if not member.admit_plain(message):
            for admitted in admitters[:taken]:
                admitted.release_plain(message)
            return False
    return True
