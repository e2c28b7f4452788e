"""What a WAL counts while it works, for ``walsvc.metrics`` to export.

Recording is off until ``walsvc.metrics.enable`` turns it on (``start_recording``): a
WAL opened while it is off gets no ``WALMetrics`` and each recording site costs one
``is None`` test per batch. A WAL opened while it is on gets one ``WALMetrics`` for its
pchannel; its parts (the serialization point, the coalescers, the backend, the
interceptors, the scanners) add to it as they work, per batch rather than per message
wherever a batch exists, in plain ints: nothing here allocates per message, takes a
lock or does I/O. The append path records through ``AppendRecorder``, one call per
site and batch. The collector reads the counters at scrape time and adds the gauges
(cache, scanners, subscriptions) and the interceptors' own counters (dedup hits,
transactions) from the WAL's state then (``snapshot``).

Units are Prometheus's base units: seconds and bytes.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import TYPE_CHECKING, Any, Final, final

__all__ = (
    "BATCH_BUCKETS",
    "CLIENT",
    "LATENCY_BUCKETS",
    "AppendRecorder",
    "ClientCounters",
    "Histogram",
    "PyAppendRecorder",
    "PyHistogram",
    "WALMetrics",
    "live_metrics",
    "recording",
    "start_recording",
    "stop_recording",
    "wal_metrics",
)

#: Upper bounds of the latency histograms, seconds (50 us to 10 s).
LATENCY_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
#: Upper bounds of the batch-size histograms, messages.
BATCH_BUCKETS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0)


@final
class PyHistogram:
    """Observations in fixed buckets: ``counts[i]`` holds those at or below
    ``bounds[i]`` and above ``bounds[i - 1]``; the last count is those above every
    bound (``+Inf``). ``observe(value, n)`` counts ``value`` ``n`` times (a batch's
    latency for each of its messages), in one bisect. ``Histogram`` is this class
    compiled where walsvc was built with a C compiler (``_cmetrics.c``)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Count ``value`` ``n`` times."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.count += n
        self.sum += value * n

    def add(self, other: PyHistogram) -> None:
        """Add ``other``'s observations (same bounds) to these."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.count += other.count
        self.sum += other.sum

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus's buckets: ``(upper bound, observations at or below it)``, the
        last one ``+Inf``."""
        buckets, total = [], 0
        for bound, count in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets


Histogram = PyHistogram


class PyAppendRecorder:
    """The append path's histograms and counters, filled once per batch by three parts:

    - a coalescer around each batch it appends: ``batch_started`` (the batch's first
      message's ``id`` and its size; returns a token) and ``batch_ended(token)`` once it
      is answered, which counts the batch's time once per message (``append_seconds``)
      and splits it into the interceptors' share (``chain_seconds``) and the answers'
      (``ack_seconds``);
    - the serialization point after each backend call: ``serialized`` counts the
      messages, the batch size, the encoding and the commit; the two ends of a batch
      meet through the first message's ``id``, which the interceptors pass down
      unchanged, without passing anything down the chain (a context variable did the
      same and cost about 2% of a 64-producer file append: measured). A batch whose
      first message was left out or replaced on the way down, or that reached the
      serialization point more than once (appended message by message), is not split;
    - the file backend after each group commit: ``committed``.

    Each reads the clock itself (``time.perf_counter``; ``now``). ``AppendRecorder`` is
    this class compiled where walsvc was built with a C compiler (``_cmetrics.c``): one
    C call per site and batch; this one's ``serialized`` took 1.6 us a call inside a busy
    64-producer append (the compiled one 0.55 us)."""

    __slots__ = (
        "_flights",
        "ack_seconds",
        "append_batches",
        "append_messages",
        "append_seconds",
        "chain_seconds",
        "commit_records",
        "commit_seconds",
        "encode_seconds",
        "segment_rollovers",
        "stage_commit_seconds",
        "written_bytes",
    )

    def __init__(self, latency_bounds: tuple[float, ...], batch_bounds: tuple[float, ...]) -> None:
        #: Messages made durable, and messages per backend call.
        self.append_messages = 0
        self.append_batches = Histogram(batch_bounds)
        #: Time to append: from a coalesced batch's start down the chain to its answer,
        #: once per message of it.
        self.append_seconds = Histogram(latency_bounds)
        #: The serialization point's stages, per backend call: encoding (ticks and
        #: envelopes), and the backend's commit (from the call to its acknowledgement).
        self.encode_seconds = Histogram(latency_bounds)
        self.stage_commit_seconds = Histogram(latency_bounds)
        #: The rest of a coalesced batch's time to append, per batch: ``chain`` (the
        #: interceptors, down and back up) and ``ack`` (from the backend's
        #: acknowledgement to the answers).
        self.chain_seconds = Histogram(latency_bounds)
        self.ack_seconds = Histogram(latency_bounds)
        #: The file backend's group commits: seconds per commit (write and fdatasync,
        #: from the hand-off to its thread to its completion on the loop), records per
        #: commit, bytes written, segments started.
        self.commit_seconds = Histogram(latency_bounds)
        self.commit_records = Histogram(batch_bounds)
        self.written_bytes = 0
        self.segment_rollovers = 0
        # The coalesced batches in flight, by token: [first id, size, started, encode,
        # commit, acked_at, serializations]; first id 0 once a later batch with the same
        # first message started (the serialization point's record goes to that one).
        self._flights: dict[int, list[Any]] = {}

    @staticmethod
    def now() -> float:
        """The recorder's clock: ``time.perf_counter``'s."""
        return perf_counter()

    def batches_in_flight(self) -> int:
        """Coalesced batches started and not yet ended."""
        return len(self._flights)

    def batch_started(self, first: int, count: int) -> int:
        """A coalesced batch of ``count`` messages, the first of ``id`` ``first``,
        starts now; the token to pass to ``batch_ended``."""
        if not first:
            raise ValueError("batch_started: first is the id of a message")
        for flight in self._flights.values():
            if flight[0] == first:
                flight[0] = 0  # the same message in two batches: the later one's
        token = next(i for i in range(len(self._flights) + 1) if i not in self._flights)
        self._flights[token] = [first, count, perf_counter(), 0.0, 0.0, 0.0, 0]
        return token

    def batch_ended(self, token: int) -> None:
        """The batch of ``token`` is answered now."""
        now = perf_counter()
        flight = self._flights.pop(token, None)
        if flight is None:
            raise ValueError("batch_ended: not a batch in flight")
        first, count, started, encode, commit, acked_at, serializations = flight
        total = now - started
        self.append_seconds.observe(total, count)
        if first and serializations == 1:
            ack = now - acked_at
            self.ack_seconds.observe(ack)
            self.chain_seconds.observe(max(total - encode - commit - ack, 0.0))

    def serialized(self, started: float, encoded: float, count: int, first: int) -> None:
        """``count`` messages, the first of ``id`` ``first``, encoded from ``started``
        to ``encoded``, are acknowledged by the backend now."""
        acked = perf_counter()
        self.append_messages += count
        self.append_batches.observe(count)
        self.encode_seconds.observe(encoded - started)
        self.stage_commit_seconds.observe(acked - encoded)
        for flight in self._flights.values():
            if flight[0] == first:
                flight[3] += encoded - started
                flight[4] += acked - encoded
                flight[5] = acked
                flight[6] += 1
                break

    def committed(self, started: float, records: int, size: int, rolled_over: bool) -> None:
        """A file group commit of ``records`` records and ``size`` bytes, handed off at
        ``started``, is done now (``rolled_over``: it started a segment)."""
        self.commit_seconds.observe(perf_counter() - started)
        self.commit_records.observe(records)
        self.written_bytes += size
        self.segment_rollovers += rolled_over


AppendRecorder = PyAppendRecorder
if not TYPE_CHECKING:  # the type checker reads the Python classes: the compiled ones' interface
    try:
        from . import _cmetrics
    except ImportError:  # built without a C compiler
        pass
    else:
        Histogram = _cmetrics.Histogram
        AppendRecorder = _cmetrics.AppendRecorder


@final
class WALMetrics(AppendRecorder):
    """The counters of one WAL (one pchannel), added to by its parts as they work: the
    append path's through ``AppendRecorder``'s calls, the rest here.

    ``snapshot`` is set by the WAL: called at scrape time, it returns the gauges of its
    state then (see ``walsvc.metrics``), or None once the WAL is closed.
    """

    __slots__ = (
        "__weakref__",
        "append_errors",
        "checkpoint_seconds",
        "consumed_messages",
        "deliver_seconds",
        "fenced",
        "pchannel",
        "read_batches",
        "scheme",
        "snapshot",
    )

    #: The plain counters (ints), here and in ``AppendRecorder``: what ``add`` sums.
    COUNTERS: Final = (
        "append_messages",
        "fenced",
        "written_bytes",
        "segment_rollovers",
        "consumed_messages",
    )

    def __init__(self, pchannel: str, scheme: str) -> None:
        super().__init__(LATENCY_BUCKETS, BATCH_BUCKETS)
        self.pchannel = pchannel
        self.scheme = scheme
        #: Appends that failed, by error type name.
        self.append_errors: dict[str, int] = {}
        #: Appends refused because a newer writer fenced this one.
        self.fenced = 0
        #: Messages handed to readers, messages per batch handed, and the time from a
        #: message's timetick (its append) to its delivery, per message.
        self.consumed_messages = 0
        self.read_batches = Histogram(BATCH_BUCKETS)
        self.deliver_seconds = Histogram(LATENCY_BUCKETS)
        #: Time to write a subscription checkpoint to its store.
        self.checkpoint_seconds = Histogram(LATENCY_BUCKETS)
        self.snapshot: Callable[[], dict[str, Any] | None] | None = None

    def histograms(self) -> tuple[Histogram, ...]:
        """Every histogram, in a fixed order."""
        return (
            self.append_batches,
            self.append_seconds,
            self.encode_seconds,
            self.stage_commit_seconds,
            self.chain_seconds,
            self.ack_seconds,
            self.commit_seconds,
            self.commit_records,
            self.read_batches,
            self.deliver_seconds,
            self.checkpoint_seconds,
        )

    def add(self, other: WALMetrics) -> None:
        """Add the counts of ``other`` (another WAL of this pchannel) to these."""
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, count in list(other.append_errors.items()):
            self.append_errors[name] = self.append_errors.get(name, 0) + count
        for mine, theirs in zip(self.histograms(), other.histograms(), strict=True):
            mine.add(theirs)

    def failed(self, name: str) -> None:
        """Count an append that raised an error of the type named ``name``."""
        self.append_errors[name] = self.append_errors.get(name, 0) + 1
        if name == "WALFenced":
            self.fenced += 1


@final
class ClientCounters:
    """What this process's ``walsvc://`` clients count, whether or not metrics are on
    (each is an event far rarer than an append)."""

    __slots__ = ("connections_lost", "reconnects", "streams_read_again")

    def __init__(self) -> None:
        #: Connections to a node lost while open (each then reconnects or fails).
        self.connections_lost = 0
        #: Connections to a node restored after a loss.
        self.reconnects = 0
        #: ``Read``s sent again for streams a node ended while it stayed up (its read of
        #: the log failed, or a resumed subscription's name was still held).
        self.streams_read_again = 0


#: The process's client counters.
CLIENT: Final = ClientCounters()

# Weak references to the metrics of live WALs; each removes itself when its WAL's
# metrics are collected.
_live: set[weakref.ref[WALMetrics]] = set()
_recording = False


def recording() -> bool:
    """True while WALs opened now get metrics."""
    return _recording


def start_recording() -> None:
    """Give every WAL opened from now on its ``WALMetrics``."""
    global _recording
    _recording = True


def stop_recording() -> None:
    """Stop giving WALs opened from now on metrics (open ones keep theirs)."""
    global _recording
    _recording = False


def wal_metrics(pchannel: str, scheme: str) -> WALMetrics | None:
    """A new ``WALMetrics`` for a WAL opening now, known to ``live_metrics`` while the
    WAL holds it; None while not recording."""
    if not _recording:
        return None
    metrics = WALMetrics(pchannel, scheme)
    _live.add(weakref.ref(metrics, _live.discard))
    return metrics


def live_metrics() -> Iterator[WALMetrics]:
    """The metrics of the WALs alive now (a WAL's go with it). The set is copied in
    one C call first, so a scrape on another thread never sees it change."""
    return (m for m in [ref() for ref in list(_live)] if m is not None)
