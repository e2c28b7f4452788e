"""The reader side of a durable subscription: a ``CheckpointWriter`` takes a scanner's
acknowledgements (``note``) and writes the newest one to the subscription's store
(``walsvc.backends._subscriptions``), forward-only and throttled."""

from __future__ import annotations

import asyncio
import math
import time
from typing import final

from walsvc.backends._subscriptions import (
    SubscriptionScope,
    SubscriptionStore,
    check_subscription_name,
)
from walsvc.core._deliver import Checkpoint
from walsvc.core._errors import BackendUnavailable, InvalidArgument, WALClosed, WALError
from walsvc.core._metrics import WALMetrics

__all__ = ("CheckpointWriter",)


@final
class CheckpointWriter:
    """Writes one subscription's newest acknowledged checkpoint to its store, forward-only
    and throttled. Use it from one event loop.

    ``note`` keeps the checkpoint with the greatest timetick; one at or below the greatest
    noted so far, or below ``start`` (the checkpoint ``load`` returned), is ignored. Every
    write stores ``scope`` with the checkpoint. At most
    one write is in flight and writes start at least ``interval`` seconds apart: the first
    note after a quiet period is written at once, later ones when the period ends (a timer
    writes the newest; no further note is needed).

    A failed background write keeps its checkpoint pending (unless a newer one was noted)
    and schedules no retry; its error (``BackendUnavailable`` wrapping anything that is not
    a ``WALError``) is raised once, by the next ``note``, ``flush`` or ``aclose``, after that
    call has done its own work.
    """

    __slots__ = (
        "_closed",
        "_failure",
        "_floor",
        "_inflight",
        "_interval",
        "_last_start",
        "_scope",
        "_store",
        "_timer",
        "metrics",
        "name",
        "pending",
        "writes",
        "written",
    )

    def __init__(
        self,
        store: SubscriptionStore,
        name: str,
        *,
        interval: float = 1.0,
        start: Checkpoint | None = None,
        scope: SubscriptionScope | None = None,
    ) -> None:
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not (interval >= 0 and math.isfinite(interval))
        ):
            raise InvalidArgument(f"interval must be a number of seconds >= 0, not {interval!r}")
        if start is not None and not isinstance(start, Checkpoint):
            raise TypeError(f"start must be a walsvc.Checkpoint or None, not {start!r}")
        self._store = store
        self._scope = scope
        #: The subscription's name.
        self.name = check_subscription_name(name)
        self._interval = float(interval)
        #: The newest checkpoint known to be durable: ``start`` until a write succeeds.
        self.written = start
        #: The newest noted checkpoint not yet handed to the store, or None.
        self.pending: Checkpoint | None = None
        #: How many store writes were started (failed ones included).
        self.writes = 0
        self._floor = -1 if start is None else start.timetick
        self._failure: WALError | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_start = -math.inf
        self._closed = False
        #: Where the time of each successful write is counted (None: not counted).
        self.metrics: WALMetrics | None = None

    def note(self, checkpoint: Checkpoint) -> None:
        """Record ``checkpoint`` as acknowledged if its timetick is greater than every one
        noted before (else ignore it) and make sure a write is scheduled. Raises
        ``WALClosed`` after ``aclose``, and the error of a failed background write."""
        if self._closed:
            raise WALClosed(f"the checkpoint writer of subscription {self.name!r} is closed")
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"note takes a walsvc.Checkpoint, not {checkpoint!r}")
        if checkpoint.timetick > self._floor:
            self._floor = checkpoint.timetick
            self.pending = checkpoint
        if self.pending is not None and self._inflight is None and self._timer is None:
            self._schedule()
        failure = self._take_failure()
        if failure is not None:
            raise failure

    async def flush(self) -> None:
        """Write the pending checkpoint now (after the write in flight, without waiting for
        the interval). When it returns, every checkpoint noted before the call is durable.
        Raises the error of this write, else that of an earlier failed background write.
        Does nothing after ``aclose``."""
        if not self._closed:
            await self._flush()

    async def aclose(self) -> None:
        """Flush (as ``flush`` does, raising its error) and stop: ``note`` raises
        ``WALClosed`` from now on, and no write starts after this returns. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cancel_timer()
        await self._flush()

    async def _flush(self) -> None:
        earlier = self._take_failure()
        target = self._floor
        while True:
            inflight = self._inflight
            if inflight is not None:
                await asyncio.shield(inflight)
                continue
            written = self.written
            if (
                self._failure is not None
                or self.pending is None
                or (written is not None and written.timetick >= target)
            ):
                break
            self._start_write()
        failure = self._take_failure() or earlier
        if failure is not None:
            raise failure

    def _take_failure(self) -> WALError | None:
        failure, self._failure = self._failure, None
        return failure

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        """Start the pending write now if the interval allows, else when it does."""
        loop = asyncio.get_running_loop()
        delay = self._last_start + self._interval - loop.time()
        if delay <= 0:
            self._start_write()
        else:
            self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if (
            not self._closed
            and self._inflight is None
            and self._failure is None
            and self.pending is not None
        ):
            self._start_write()

    def _start_write(self) -> None:
        self._cancel_timer()
        checkpoint = self.pending
        assert checkpoint is not None
        self.pending = None
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        self.writes += 1
        self._inflight = loop.create_task(
            self._write(checkpoint), name=f"walsvc checkpoint {self.name}"
        )

    async def _write(self, checkpoint: Checkpoint) -> None:
        """The in-flight write: never raises (but for cancellation); a failure is kept in
        ``_failure`` for the next call to raise."""
        started = time.perf_counter()
        try:
            await self._store.save(self.name, checkpoint, self._scope)
        except asyncio.CancelledError:
            self._inflight = None
            self._restore(checkpoint)
            raise
        except Exception as exc:  # kept and raised by the next call, never dropped
            self._inflight = None
            self._restore(checkpoint)
            if isinstance(exc, WALError):
                failure = exc
            else:
                failure = BackendUnavailable(
                    f"saving the checkpoint of subscription {self.name!r} failed: {exc!r}"
                )
                failure.__cause__ = exc  # as ``raise ... from exc`` does
                failure.__suppress_context__ = True
            if self._failure is None:
                self._failure = failure
            return
        if self.metrics is not None:
            self.metrics.checkpoint_seconds.observe(time.perf_counter() - started)
        self._inflight = None
        written = self.written
        if written is None or checkpoint.timetick > written.timetick:
            self.written = checkpoint
        if not self._closed and self.pending is not None and self._timer is None:
            self._schedule()

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Put back a checkpoint whose write did not complete, unless a newer one waits."""
        if self.pending is None:
            self.pending = checkpoint
