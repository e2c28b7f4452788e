"""A stream's scanner stats for its client (protocol version 2, ``StreamStats``), so
that a remote scanner's ``stats()`` shows the node's scanner: where it reads (tail cache
or backend), its hand-offs and fallbacks, what its stages reject or hold, and its
subscription's durable checkpoint.

``Scanner.stats()`` is synchronous, so the client cannot ask: the node tells it, and
what it tells it costs the delivery path next to nothing. Per ``Delivered`` the pump
sends, it compares two counters of the scanner with those the reporter last looked at:
``LocalScanner.switches`` (its source's hand-offs plus fallbacks) and
``LocalScanner.stage_changes`` (batches its reorder or transaction stage changed); only
when one moved, or the scanner reads the backend, does the reporter act. It sends:

- the stats when the stream starts (``report``, from ``Streams.open``);
- at once, ahead of the messages in the same frame, when the source switched (a hand-off
  to the cache, a fallback to the backend, a subscription's start);
- otherwise at most once per ``STATS_INTERVAL``: such a ``Delivered`` (its stages
  changed something, or it comes from the backend) arms a timer (if none is armed) for
  the next multiple of the interval on the loop's clock (so the timers of all streams
  fire together), which sends the stats if they changed since the last sent. The timer
  is armed again while the stats may change with nothing delivered: before a
  subscription started, while the reorder or transaction stage holds messages, while
  an acknowledged checkpoint is not yet written (an ``Ack`` arms it too), and while the
  scanner reads the backend and sent something since the look before (so the look an
  interval after the last backend batch of a scanner that caught up sees its hand-off
  to the cache, made as it asked for the next batch);
- before the ``Done`` of a ``Flush`` (``report``): a flushed checkpoint shows in the
  client's stats once ``flush`` returns.

A tailing stream whose stats do not change costs two counter compares per
``Delivered`` and no timer; an idle stream costs nothing. A timer that finds the
connection above its send-queue limit sends nothing and looks again an interval later.
``close`` (the stream ended) cancels the timer.
"""

from __future__ import annotations

import asyncio
from typing import Final, final

from walsvc.core._api import ScannerStats
from walsvc.read._scanner import LocalScanner
from walsvc.remote._frames import FrameWriter
from walsvc.remote._protocol import StreamStats

from ._wire import encode

__all__ = ("STATS_INTERVAL", "StatsReporter", "stream_stats")

#: Seconds between two reports of a stream's stats that changed in other ways than a
#: source switch.
STATS_INTERVAL: Final = 0.1


def stream_stats(stream: int, stats: ScannerStats) -> StreamStats:
    """``stats`` of the node's scanner as ``StreamStats`` for the stream ``stream``."""
    checkpoint = stats.checkpoint
    if checkpoint is None:
        wire_checkpoint = None
    else:
        lc = checkpoint.last_confirmed_id
        wire_checkpoint = (None if lc is None else lc.marshal(), checkpoint.timetick)
    return StreamStats(
        stream,
        stats.source,
        stats.handoffs,
        stats.fallbacks,
        stats.rejected,
        stats.held_for_order,
        stats.open_txns,
        stats.txn_bytes,
        wire_checkpoint,
    )


@final
class StatsReporter:
    """Sends the stats of the scanner of stream ``stream`` to its client (see the module
    docstring)."""

    __slots__ = (
        "_acked",
        "_backend_looked",
        "_backend_sent",
        "_closed",
        "_interval",
        "_last",
        "_scanner",
        "_stream",
        "_timer",
        "_writer",
        "on_backend",
        "stage_changes",
        "switches",
    )

    def __init__(
        self,
        stream: int,
        scanner: LocalScanner,
        writer: FrameWriter,
        interval: float = STATS_INTERVAL,
    ) -> None:
        self._stream = stream
        self._scanner = scanner
        self._writer = writer
        self._interval = interval
        #: ``scanner.switches`` and ``scanner.stage_changes`` when the stats were last
        #: looked at, and whether they said the backend.
        self.switches = -2
        self.stage_changes = -1
        self.on_backend = False
        #: ``Delivered`` sent while the scanner read the backend, and their number at the
        #: last look.
        self._backend_sent = self._backend_looked = 0
        self._last: StreamStats | None = None
        #: The greatest checkpoint timetick the client acknowledged.
        self._acked = -1
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def report(self) -> None:
        """Send the stats now, if they differ from the last sent; arm the timer while
        they may change with nothing delivered."""
        if self._closed:
            return
        scanner = self._scanner
        self.switches, self.stage_changes = scanner.switches, scanner.stage_changes
        stats = stream_stats(self._stream, scanner.stats())
        self.on_backend = stats.source == "backend"
        if stats != self._last:
            self._last = stats
            self._writer.send(encode(stats))
        # Reading the backend and sent something since the last look: look again (the
        # hand-off of a scanner that caught up follows its last batch; one look an
        # interval after that batch sees it, however its sending was spread out).
        moved = self._backend_sent != self._backend_looked
        self._backend_looked = self._backend_sent
        if self._timer is None and (self._unsettled(stats) or (moved and self.on_backend)):
            self._arm()

    def delivering(self) -> None:
        """The pump is about to send a ``Delivered``, and the scanner's source switched,
        its stages changed something or it reads the backend: report a switch at once
        (the messages follow in the same frame), anything else within the interval."""
        if self._scanner.switches != self.switches:
            self.report()
        if self.on_backend:
            self._backend_sent += 1
        if self._timer is None and not self._closed:
            self._arm()

    def acked(self, checkpoint_tick: int) -> None:
        """The client acknowledged a checkpoint: report it once it is written."""
        if checkpoint_tick > self._acked:
            self._acked = checkpoint_tick
        if self._timer is None and not self._closed:
            self._arm()

    def close(self) -> None:
        """The stream ended: send nothing more."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        # On the loop's grid of intervals, not an interval from now: the timers of all
        # the streams fire in the same loop iteration rather than each waking the loop,
        # and one stream's looks still lie an interval apart.
        loop, interval = asyncio.get_running_loop(), self._interval
        self._timer = loop.call_at((loop.time() // interval + 1) * interval, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        if self._writer.closed:
            self._closed = True
        elif not self._writer.writable:  # the peer reads too little: look again later
            self._arm()
        else:
            self.report()

    def _unsettled(self, stats: StreamStats) -> bool:
        """True while the stats may change with nothing delivered: a subscription not
        started yet, messages held for order or in open transactions, an acknowledged
        checkpoint not written yet."""
        if stats.source == "not started" or stats.held_for_order or stats.open_txns:
            return True
        checkpoint = stats.checkpoint
        return self._acked > (-1 if checkpoint is None else checkpoint[1])
