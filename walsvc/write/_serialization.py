"""The serialization point of a writer: where a message gets its timetick and
last-confirmed id, becomes an envelope and is handed to the backend.

``SerializationPoint.serialize`` (and its forms for a batch and for backends whose
appends are durable when made) is the innermost step of every interceptor chain. In one
synchronous step it allocates the tick, chooses the last-confirmed id, encodes the
envelope and calls the backend, whose ``append`` orders the log: with no ``await``
between them, log order equals timetick order. Once the backend acknowledges, it records
the newest acknowledged id and puts the message in the tail cache.

The last-confirmed id a message carries is the oldest pin (``pins``: a transaction's
BeginTxn, a recovering writer), else the newest acknowledged id as of at most
``CONFIRM_STEP`` ticks ago: an older id is as good a resume point (readers skip by
timetick), and one shared by a run of appends encodes its ext section once.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import Final, final

from scanners._tail_cache import TailCache
from walsvc.backends._base import Backend
from walsvc.core._codec import HEADER_SIZE
from walsvc.core._encode import (
    are_keyed,
    are_plain,
    encode,
    encode_keyed_many,
    encode_plain,
    encode_plain_many,
    encode_plain_message,
    keyed_ext_prefix,
    last_confirmed_ext,
)
from walsvc.core._errors import AppendOutcomeUnknown, MessageTooLarge, WALError
from walsvc.core._ids import MessageId
from walsvc.core._message import NO_PROPERTIES, AppendResult, ImmutableMessage, Message
from walsvc.core._metrics import WALMetrics
from walsvc.core._timetick import TimetickAllocator

__all__ = ("CONFIRM_STEP", "SerializationPoint")

#: Envelopes carry a last-confirmed id refreshed once this many ticks passed since the
#: last refresh: at least every millisecond of the hybrid clock, and every 256 appends.
CONFIRM_STEP: Final = 255


@final
class SerializationPoint:
    """One writer's serialization point (see the module docstring)."""

    __slots__ = (
        "_allocator",
        "_backend",
        "_confirmed",
        "_confirmed_tick",
        "_ext",
        "_ext_id",
        "_keyed_ext",
        "_keyed_ext_id",
        "_max_message_size",
        "_max_payload",
        "_term",
        "cache",
        "data_tick",
        "last_acked",
        "last_acked_tick",
        "last_tick",
        "metrics",
        "on_activity",
        "pins",
    )

    def __init__(
        self,
        backend: Backend,
        allocator: TimetickAllocator,
        *,
        max_message_size: int,
        cache: TailCache | None,
    ) -> None:
        self._backend = backend
        self._allocator = allocator
        self._term = backend.term
        self._max_message_size = max_message_size
        self._max_payload = max_message_size - HEADER_SIZE
        #: The writer's tail cache (None for a read-only WAL).
        self.cache = cache
        #: The newest acknowledged id, and its timetick.
        self.last_acked: MessageId | None = None
        self.last_acked_tick = -1
        #: Last-confirmed ids pinned (token -> id): the oldest pinned one wins.
        self.pins: dict[object, MessageId | None] = {}
        #: The newest tick allocated (idle ticks included), and the newest data tick.
        self.last_tick = 0
        self.data_tick = 0
        #: Called before each message is encoded while set (the timetick sync's wake-up
        #: for an idle WAL: ``WALContext.wake_on_activity``).
        self.on_activity: Callable[[], object] | None = None
        #: Where appends are counted (messages, bytes, batch sizes, the encode and
        #: commit stages, errors by type); None: not counted.
        self.metrics: WALMetrics | None = None
        self._confirmed: MessageId | None = None
        self._confirmed_tick = 0
        self._ext_id: MessageId | None = None  # the last-confirmed id _ext encodes
        self._ext = b""
        # The same for the ext section of keyed messages, but for the key that ends it.
        self._keyed_ext_id: MessageId | None = None
        self._keyed_ext = keyed_ext_prefix(None)

    def last_confirmed_id(self) -> MessageId | None:
        """The last-confirmed id a message serialized now would carry at the least: the
        oldest pin, else the newest acknowledged id."""
        pins = self.pins
        return next(iter(pins.values())) if pins else self.last_acked

    def encode(self, message: Message) -> tuple[bytes, int, MessageId | None]:
        if self.on_activity is not None:
            self.on_activity()
        payload = message.payload
        if len(payload) > self._max_payload:
            raise MessageTooLarge(
                f"message payload of {len(payload)} bytes exceeds max_message_size"
                f" {self._max_message_size}"
            )
        tick = self._allocator.allocate()
        if self.pins:
            last_confirmed = next(iter(self.pins.values()))
        else:
            # A slightly older last-confirmed id is as good a resume point (readers skip
            # by timetick), and one shared by a run of appends is encoded once.
            if tick - self._confirmed_tick > CONFIRM_STEP or self._confirmed is None:
                self._confirmed = self.last_acked
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
                self.last_tick = self.data_tick = tick
                return plain, tick, last_confirmed
            record = encode_plain(  # too large: the check below says by how much
                message.type, message.vchannel, payload, tick, self._term, self._ext
            )
        if len(record) > self._max_message_size:
            raise MessageTooLarge(
                f"encoded message of {len(record)} bytes exceeds max_message_size"
                f" {self._max_message_size}"
            )
        self.last_tick = self.data_tick = tick
        return record, tick, last_confirmed

    async def serialize(self, message: Message) -> AppendResult:
        """The innermost step of every chain: tick, last-confirmed id, envelope, backend,
        and (once acknowledged) the tail cache."""
        metrics = self.metrics
        started = perf_counter() if metrics is not None else 0.0
        record, tick, last_confirmed = self.encode(message)
        # Nothing may await between encode (which allocates the tick) and the backend
        # call (the serialization point): that keeps log order equal to tick order.
        cache = self.cache
        try:
            acked = self._backend.append((record,))
        except WALError as exc:
            self._count_failure(exc)
            raise
        except Exception as exc:
            raise self._outcome_unknown(exc) from exc
        encoded = perf_counter() if metrics is not None else 0.0
        slot = cache.reserve(1) if cache is not None else -1
        try:
            ids = await acked
        except BaseException as exc:
            if cache is not None:
                cache.lose(slot, 1)
            if isinstance(exc, Exception) and not isinstance(exc, WALError):
                raise self._outcome_unknown(exc) from exc
            self._count_failure(exc)
            raise
        if metrics is not None:
            metrics.serialized(started, encoded, 1, id(message))
        return self._acknowledged(message, ids[0], tick, last_confirmed, slot)

    def serialize_now(self, message: Message) -> AppendResult:
        """``serialize`` on a backend whose appends are durable when made
        (``Backend.append_now``): the same steps, without an ``await``."""
        metrics = self.metrics
        started = perf_counter() if metrics is not None else 0.0
        record, tick, last_confirmed = self.encode(message)
        encoded = perf_counter() if metrics is not None else 0.0
        cache = self.cache
        try:
            ids = self._backend.append_now((record,))
        except WALError as exc:
            self._count_failure(exc)
            raise
        except Exception as exc:
            if cache is not None:  # it may be in the log: the cache cannot vouch for it
                cache.lose(cache.reserve(1), 1)
            raise self._outcome_unknown(exc) from exc
        if metrics is not None:
            metrics.serialized(started, encoded, 1, id(message))
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
        self.last_acked = message_id
        self.last_acked_tick = tick
        cache = self.cache
        if slot >= 0:
            assert cache is not None
            cache.put(slot, (self._cached(message, message_id, tick, last_confirmed),))
        elif cache is not None:
            cache.acked(1)
        return AppendResult(message_id, tick, last_confirmed)

    def encode_batch(
        self, messages: Sequence[Message]
    ) -> tuple[list[bytes], Sequence[int], Iterable[MessageId | None]]:
        """``encode`` for a batch: the records, their ticks and their last-confirmed ids.
        Consecutive ticks from one allocator call, one last-confirmed id and ext section
        and one call of the (compiled) batch encoder when no message has properties or a
        txn (keys are welcome: coalesced keyed appends); else message by message."""
        if self.on_activity is not None:
            self.on_activity()
        allocate_many = getattr(self._allocator, "allocate_many", None)
        batch = messages if type(messages) is list else list(messages)
        keyed = False
        if allocate_many is not None and not are_plain(batch, self._max_payload):
            keyed = are_keyed(batch, self._max_payload)
            if not keyed:
                allocate_many = None
        if allocate_many is None:
            max_payload = self._max_payload
            for message in batch:  # a payload too large fails the batch before any tick
                if len(message.payload) > max_payload:
                    self.encode(message)  # raises MessageTooLarge, saying so
            encoded = [self.encode(m) for m in batch]
            return [e[0] for e in encoded], [e[1] for e in encoded], [e[2] for e in encoded]
        count = len(batch)
        first: int = allocate_many(count)
        # The choice of last-confirmed id and ext is encode's, once per batch here
        # (encode keeps it inline: it runs once per single append).
        if self.pins:
            last_confirmed = next(iter(self.pins.values()))
        else:
            if first - self._confirmed_tick > CONFIRM_STEP or self._confirmed is None:
                self._confirmed = self.last_acked
                self._confirmed_tick = first
            last_confirmed = self._confirmed
        if last_confirmed is not self._ext_id:
            self._ext_id = last_confirmed
            self._ext = b"" if last_confirmed is None else last_confirmed_ext(last_confirmed)
        limit = self._max_message_size
        if keyed:
            if last_confirmed is not self._keyed_ext_id:
                self._keyed_ext_id = last_confirmed
                self._keyed_ext = keyed_ext_prefix(last_confirmed)
            records = encode_keyed_many(batch, first, self._term, self._ext, self._keyed_ext, limit)
        else:
            records = encode_plain_many(batch, first, self._term, self._ext, limit)
        if records is None:
            for tick, message in enumerate(batch, first):
                size = len(
                    encode(message, timetick=tick, term=self._term, last_confirmed=last_confirmed)
                )
                if size > limit:
                    raise MessageTooLarge(
                        f"encoded message of {size} bytes exceeds max_message_size {limit}"
                    )
        assert records is not None
        self.last_tick = self.data_tick = first + count - 1
        return records, range(first, first + count), itertools.repeat(last_confirmed, count)

    async def serialize_batch(self, messages: Sequence[Message]) -> list[AppendResult]:
        """``serialize`` for a batch: contiguous in the log, one backend call."""
        metrics = self.metrics
        started = perf_counter() if metrics is not None else 0.0
        records, ticks, confirmed = self.encode_batch(messages)
        if not records:
            return []
        count = len(records)
        cache = self.cache
        try:
            acked = self._backend.append(records)
        except WALError as exc:
            self._count_failure(exc)
            raise
        except Exception as exc:
            raise self._outcome_unknown(exc) from exc
        encoded = perf_counter() if metrics is not None else 0.0
        slot = cache.reserve(count) if cache is not None else -1
        try:
            ids = await acked
        except BaseException as exc:
            if cache is not None:
                cache.lose(slot, count)
            if isinstance(exc, Exception) and not isinstance(exc, WALError):
                raise self._outcome_unknown(exc) from exc
            self._count_failure(exc)
            raise
        if metrics is not None:
            metrics.serialized(started, encoded, count, id(messages[0]))
        self.last_acked = ids[-1]
        self.last_acked_tick = ticks[-1]
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

    def _count_failure(self, error: BaseException) -> None:
        """Count a failed append (by its error's type) if metrics are on."""
        if self.metrics is not None:
            self.metrics.failed(type(error).__name__)

    def _outcome_unknown(self, exc: Exception) -> AppendOutcomeUnknown:
        if self.metrics is not None:
            self.metrics.failed(AppendOutcomeUnknown.__name__)
        return AppendOutcomeUnknown(
            f"appending to {self._backend.pchannel!r} failed after the record(s) were handed to the"
            f" backend ({exc!r}); they may or may not be in the log"
        )
