"""Streaming reads: ``spark.readStream.format("walsvc")``.

An offset is a JSON object of pchannel -> the marshalled id of the newest message a
micro-batch covered (null: nothing yet). A micro-batch reads the id ranges from the
previous offset to the next (see ``_ranges``), so after a restart from Spark's
checkpoint every message, and every committed transaction, lands in exactly one
micro-batch; a transaction still open at an offset lands in the micro-batch that
holds its commit, and a rolled-back one in none.

``maxRecordsPerTrigger`` bounds the log records (TimeTicks and transaction control
included) a micro-batch covers, shared out fairly between pchannels. It counts ids, so
it holds on backends with sequence ids (file, Kafka); on Pulsar a micro-batch takes
whatever is there. ``Trigger.AvailableNow`` reads up to the newest ids at the moment the
query starts, in micro-batches of at most ``maxRecordsPerTrigger`` records.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from walsvc.core._errors import InvalidArgument
from walsvc.core._ids import SequenceMessageId

from ._batch import RangePartition, read_partition
from ._options import SourceOptions
from ._ranges import IdRange, checked_id, latest_ids, tile
from ._sync import run

__all__ = ("Offsets", "WalStreamReader", "share_out")

#: pchannel -> marshalled id of the newest message covered (None: nothing yet).
Offsets = dict[str, str | None]


class WalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the options' pchannels, from ``startAfter`` (or their start)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target: Offsets | None = None  # Trigger.AvailableNow stops here

    def initialOffset(self) -> Offsets:
        start = self.options.start_after
        for pchannel, marshalled in start.items():
            checked_id(pchannel, marshalled)
        return {p: start.get(p) for p in self.options.pchannels}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._newest()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        newest = self.target if self.target is not None else self._newest()
        ends = {p: newest.get(p) or start.get(p) for p in self.options.pchannels}
        if isinstance(limit, ReadMaxRows):
            ends = share_out(start, ends, limit.max_rows)
        return ends

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        wholes = [
            IdRange(pchannel, start.get(pchannel), high)
            for pchannel in self.options.pchannels
            if (high := end.get(pchannel)) is not None and high != start.get(pchannel)
        ]
        return [RangePartition(part) for part in tile(wholes, self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder when there are no partitions
        return read_partition(self.options, partition.owned)

    def commit(self, end: Offsets) -> None:
        """Nothing to release: reading never consumes the log."""

    def _newest(self) -> Offsets:
        latest = run(latest_ids(self.options))
        return {p: None if i is None else i.marshal() for p, i in latest.items()}


def share_out(start: Mapping[str, str | None], ends: Offsets, budget: int) -> Offsets:
    """``ends`` moved back so that the ranges from ``start`` hold at most ``budget`` ids
    together, shared fairly (each pchannel gets an equal share; what one cannot use goes
    to the others). Pchannels whose ids are not sequence numbers keep their end."""
    backlog: dict[str, tuple[int, SequenceMessageId]] = {}
    for pchannel, marshalled in ends.items():
        low = start.get(pchannel)
        if marshalled is None or marshalled == low:
            continue
        end = checked_id(pchannel, marshalled)
        if not isinstance(end, SequenceMessageId):
            continue
        first = -1 if low is None else checked_id(pchannel, low)
        if not isinstance(first, int) and type(first) is not type(end):
            raise InvalidArgument(
                f"pchannel {pchannel!r}: offsets {low} and {marshalled} are ids of other backends"
            )
        first_seq = first if isinstance(first, int) else first.seq
        backlog[pchannel] = (max(end.seq - first_seq, 0), end)
    left = budget
    shares: dict[str, int] = {}
    by_need = sorted(backlog, key=lambda p: backlog[p][0])
    for served, pchannel in enumerate(by_need):
        shares[pchannel] = min(backlog[pchannel][0], left // (len(by_need) - served))
        left -= shares[pchannel]
    out = dict(ends)
    for pchannel, (count, end) in backlog.items():
        granted = shares[pchannel]
        if granted < count:
            cut = type(end)(end.seq - count + granted)
            out[pchannel] = start.get(pchannel) if granted == 0 else cut.marshal()
    return out
