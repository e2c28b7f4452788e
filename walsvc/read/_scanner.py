"""The scanner users iterate: one pchannel's messages as readers want them.

The read pipeline, per scanner:

    LogSource (tail cache or backend, hand-offs, idle TimeTicks; vchannel/type filter)
      -> ReorderBuffer   timetick order; rejects tick regressions and stale-term appends
      -> TxnBuffer       one TXN message per committed transaction; rollbacks vanish
      -> timetick floor  ``timetick_gt/gte`` filters and checkpoint resumes
      -> the user, who may ``ack`` messages into a durable subscription

A ``raw`` scanner skips the reorder and transaction stages and delivers the log as
stored (what interceptors and tools read).

Which scanners want the writer's idle TimeTicks (never written; published every 10 ms
while the writer is idle): those that deliver ticks (``raw``, ``timeticks=True``),
those whose reorder buffer releases at ticks (``ordered=False``), and a subscription
whose checkpoint an idle tick would move: every delivery is acknowledged and a TimeTick
the pipeline dropped lies above every checkpoint noted (an idle tick's checkpoint names
the newest message's tick). Every other scanner waits for data only
(``LogSource.want_idle_ticks``), so idle writers do not wake it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final, final

from scanners._reorder import ReorderBuffer
from scanners._txn_buffer import TxnBuffer
from walsvc.backends._subscriptions import SubscriptionScope, SubscriptionStore, check_scope
from walsvc.core._api import Scanner, ScannerStats
from walsvc.core._deliver import Checkpoint, DeliverPolicy
from walsvc.core._errors import InvalidArgument, WALClosed
from walsvc.core._filter import Filter
from walsvc.core._message import ImmutableMessage, MessageType
from walsvc.core._metrics import WALMetrics
from walsvc.core._timetick import physical_ms

from ._checkpoints import CheckpointWriter
from ._source import LogSource

__all__ = ("LocalScanner", "Scanner", "ScannerStats", "Subscription")

#: Opens the source of a scanner from a (backend-level) deliver policy and a filter.
OpenSource = Callable[[DeliverPolicy, Filter], LogSource]

_TIME_TICK: Final = MessageType.TIME_TICK


@final
class Subscription:
    """A named, durable resume point: the store it lives in, its name, how often its
    checkpoint is written and the scope (vchannels, types) it reads."""

    __slots__ = ("interval", "name", "scope", "store")

    def __init__(
        self, store: SubscriptionStore, name: str, interval: float, scope: SubscriptionScope
    ) -> None:
        self.store = store
        self.name = name
        self.interval = interval
        self.scope = scope


@final
class LocalScanner(Scanner):
    """A scanner of a WAL in this process: the read pipeline above over its log source.

    Messages of one pchannel, as an async iterator and async context manager.

    Iteration waits for new messages at the end of the log; it ends only when this scanner
    is closed with ``aclose()``. If the WAL is closed underneath it, iteration raises
    ``WALClosed`` instead, so a reader never mistakes a shutdown for the end of the log.
    Unless read ``raw``, messages come in timetick order, a transaction appears only
    once committed, as one ``MessageType.TXN`` message, and the WAL's own TimeTicks are
    left out unless asked for (``timeticks``).
    """

    __slots__ = (
        "_acked_last",
        "_checkpoints",
        "_deliver",
        "_delivered",
        "_dropped_tick",
        "_floor",
        "_last_out",
        "_metrics",
        "_noted_tick",
        "_on_close",
        "_open_source",
        "_reorder",
        "_source",
        "_source_filter",
        "_subscription",
        "_tick_stages",
        "_timeticks",
        "_txns",
        "_user_closed",
        "_wal_closed",
        "stage_changes",
    )

    def __init__(
        self,
        open_source: OpenSource,
        on_close: Callable[[LocalScanner], None],
        *,
        deliver: DeliverPolicy,
        selected: Filter,
        raw: bool = False,
        timeticks: bool = False,
        ordered: bool = True,
        txn_buffer_bytes: int = 64 << 20,
        subscription: Subscription | None = None,
        metrics: WALMetrics | None = None,
    ) -> None:
        super().__init__()
        self._metrics = metrics
        self._open_source = open_source
        self._on_close = on_close
        self._user_closed = False
        self._wal_closed = False
        self._delivered = 0
        #: Batches the reorder or transaction stage changed (rejected, held or released
        #: messages, opened or ended transactions): their figures in ``stats()`` change
        #: only with it (a node checks it per batch it sends).
        self.stage_changes = 0
        self._timeticks = raw or timeticks
        # The last message handed out, and whether an ack covered it: while every
        # delivered message is acknowledged, the TimeTicks left out move a subscription's
        # checkpoint on (a filtered subscription on a quiet vchannel still advances).
        self._last_out: ImmutableMessage | None = None
        self._acked_last = True
        # The greatest tick of a TimeTick left out, and of a checkpoint noted: an idle
        # tick moves the checkpoint only while the first is greater.
        self._dropped_tick = -1
        self._noted_tick = -1
        # Stages that need idle ticks whatever the state: delivery, a reorder buffer
        # that releases at ticks.
        self._tick_stages = raw or timeticks or not ordered
        self._reorder = None if raw else ReorderBuffer(ordered=ordered)
        self._txns = None if raw else TxnBuffer(max_bytes=txn_buffer_bytes)
        if raw or selected.min_timetick <= 0:
            self._source_filter, self._floor = selected, -1
        else:  # transaction bodies carry ticks below their commit's: filter after assembly
            self._source_filter = Filter(vchannels=selected.vchannels, types=selected.types)
            self._floor = selected.min_timetick - 1
        self._subscription = subscription
        self._checkpoints: CheckpointWriter | None = None
        self._deliver = deliver
        self._source: LogSource | None = None
        if subscription is None:  # else started by the first read, from the stored point
            self._start(deliver)

    def _start(self, deliver: DeliverPolicy) -> LogSource:
        if deliver.kind == "checkpoint":
            self._floor = max(self._floor, deliver.after_timetick)
        source = self._source = self._open_source(deliver.backend_policy(), self._source_filter)
        source.want_idle_ticks(self._wants_idle_ticks())
        return source

    def _wants_idle_ticks(self) -> bool:
        """True if an idle tick would reach the user, release held messages or move the
        subscription's checkpoint (see the module docstring)."""
        return self._tick_stages or (
            self._checkpoints is not None
            and self._acked_last
            and self._dropped_tick > self._noted_tick
        )

    async def _start_subscription(self, subscription: Subscription) -> LogSource:
        stored = await subscription.store.load_stored(subscription.name)
        if self._user_closed or self._wal_closed:
            # Closed while loading: the close released the claim and had nothing to
            # close or flush; open nothing now (``_next_batch`` ends the iteration).
            raise WALClosed("the scanner was closed")
        start = None if stored is None else stored.checkpoint
        if stored is not None:
            check_scope(subscription.name, stored.scope, subscription.scope)
        self._checkpoints = CheckpointWriter(
            subscription.store,
            subscription.name,
            interval=subscription.interval,
            start=start,
            scope=subscription.scope,
        )
        self._checkpoints.metrics = self._metrics
        deliver = self._deliver if start is None else DeliverPolicy.from_checkpoint(start)
        return self._start(deliver)

    async def _next_batch(self) -> Sequence[ImmutableMessage]:
        if self._user_closed:
            raise StopAsyncIteration
        if self._wal_closed:
            raise WALClosed("the WAL of this scanner is closed")
        try:
            source = self._source
            if source is None:
                assert self._subscription is not None
                source = await self._start_subscription(self._subscription)
            while True:
                if not self._tick_stages:
                    wanted = self._wants_idle_ticks()
                    if wanted is not source.idle_ticks:
                        source.want_idle_ticks(wanted)
                batch = staged = await source.next_batch()
                if self._reorder is not None:
                    staged = self._reorder.push(staged)
                if self._txns is not None and staged:
                    staged = self._txns.push(staged)
                if staged is not batch:  # (each returns its input when it changed nothing)
                    self.stage_changes += 1
                    batch = staged
                if self._floor >= 0 and batch:
                    batch = self._above_floor(batch)
                if batch and not self._timeticks:
                    batch = self._without_ticks(batch)
                if batch:
                    self._delivered += len(batch)
                    self._last_out, self._acked_last = batch[-1], False
                    if self._metrics is not None:
                        _count_delivered(self._metrics, batch)
                    return batch
        except WALClosed:
            if self._user_closed:
                raise StopAsyncIteration from None
            raise

    def _without_ticks(self, batch: Sequence[ImmutableMessage]) -> Sequence[ImmutableMessage]:
        """``batch`` without TimeTicks. A batch of ticks alone moves the subscription's
        checkpoint to its last tick if every message delivered so far is acknowledged."""
        kept = [m for m in batch if m.type is not _TIME_TICK]
        checkpoints = self._checkpoints
        if checkpoints is not None and len(kept) < len(batch):
            if not kept and self._acked_last:
                checkpoint = batch[-1].checkpoint
                checkpoints.note(checkpoint)
                self._noted_tick = max(self._noted_tick, checkpoint.timetick)
            for message in reversed(batch):
                if message.type is _TIME_TICK:
                    self._dropped_tick = max(self._dropped_tick, message.checkpoint.timetick)
                    break
        return kept

    def _above_floor(self, batch: Sequence[ImmutableMessage]) -> Sequence[ImmutableMessage]:
        """Drop messages at or below the timetick floor; batches come in tick order, so
        once one message passes, every later one does and the floor is lifted."""
        floor = self._floor
        if batch[-1].timetick <= floor:
            return ()
        self._floor = -1
        if batch[0].timetick > floor:
            return batch
        return [m for m in batch if m.timetick > floor]

    # -- subscriptions ------------------------------------------------------------------

    async def ack(self, message: ImmutableMessage) -> None:
        """Acknowledge ``message`` (and everything delivered before it): the subscription
        resumes after it. Checkpoint writes are forward-only and throttled; ``aclose``
        flushes the last one. Raises ``InvalidArgument`` without a subscription, and the
        error of a failed checkpoint write."""
        if self._subscription is None:
            raise InvalidArgument("ack needs a scanner read with subscription='name'")
        if not isinstance(message, ImmutableMessage):
            raise TypeError(f"ack takes a delivered walsvc.ImmutableMessage, not {message!r}")
        self.acknowledge(message.checkpoint, message.timetick)

    def acknowledge(self, checkpoint: Checkpoint, timetick: int) -> None:
        """``ack`` of a message known by its checkpoint and its timetick (how a node acks
        for the remote reader it delivered the message to): the same checks and effect."""
        if self._subscription is None:
            raise InvalidArgument("ack needs a scanner read with subscription='name'")
        if self._checkpoints is None:
            raise InvalidArgument("ack of a message this scanner has not delivered yet")
        self._checkpoints.note(checkpoint)
        self._noted_tick = max(self._noted_tick, checkpoint.timetick)
        last = self._last_out
        if last is not None and timetick >= last.timetick:
            self._acked_last = True
        source = self._source
        if source is not None and not source.idle_ticks and self._wants_idle_ticks():
            source.want_idle_ticks(True)  # (a read may be waiting: idle ticks wake it now)

    async def flush(self) -> None:
        """Write the subscription's latest acknowledged checkpoint now."""
        if self._checkpoints is not None:
            await self._checkpoints.flush()

    # -- stats and closing --------------------------------------------------------------

    def stats(self) -> ScannerStats:
        """A snapshot of this scanner (see ``ScannerStats``)."""
        source, reorder, txns = self._source, self._reorder, self._txns
        return ScannerStats(
            source="not started" if source is None else source.mode,
            position=None if source is None else source.position,
            delivered=self._delivered,
            handoffs=0 if source is None else source.handoffs,
            fallbacks=0 if source is None else source.fallbacks,
            rejected=0 if reorder is None else reorder.rejected,
            held_for_order=0 if reorder is None else reorder.held,
            open_txns=0 if txns is None else txns.open_count,
            txn_bytes=0 if txns is None else txns.held_bytes,
            checkpoint=None if self._checkpoints is None else self._checkpoints.written,
        )

    @property
    def subscription_name(self) -> str | None:
        """The durable subscription this scanner reads (None: it reads without one)."""
        return None if self._subscription is None else self._subscription.name

    @property
    def switches(self) -> int:
        """How often the source switched between the tail cache and the backend (its
        hand-offs plus fallbacks; -1 before it started): ``stats().source`` changes only
        with it, and reading it costs far less (a node checks it per batch it sends)."""
        source = self._source
        return -1 if source is None else source.handoffs + source.fallbacks

    async def aclose(self) -> None:
        """Stop the scanner (iteration then ends) and flush its subscription's checkpoint.
        Idempotent."""
        if self._user_closed:
            return
        self._user_closed = True
        self._batch, self._index = (), 0  # nothing buffered is delivered after close
        self._on_close(self)
        await self._release()

    async def _close_for_wal(self) -> None:
        """Close because the WAL closed: pending and later reads raise ``WALClosed``."""
        self._wal_closed = True
        self._batch, self._index = (), 0
        await self._release()

    async def _release(self) -> None:
        try:
            if self._source is not None:
                await self._source.aclose()
            if self._checkpoints is not None:
                await self._checkpoints.aclose()
        finally:
            if self._subscription is not None:
                self._subscription.store.release(self._subscription.name)

    async def __aenter__(self) -> LocalScanner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _count_delivered(metrics: WALMetrics, batch: Sequence[ImmutableMessage]) -> None:
    """Count ``batch`` handed to a reader, and the time since its newest message's
    timetick (its append; wall-clock milliseconds) once per message of it."""
    count = len(batch)
    metrics.consumed_messages += count
    metrics.read_batches.observe(count)
    behind_ms = time.time() * 1000.0 - physical_ms(batch[-1].timetick)
    metrics.deliver_seconds.observe(max(behind_ms, 0.0) / 1000.0, count)
