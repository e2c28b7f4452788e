"""Where a read must start to include every message from a timetick on (a binary search
over offsets; see ``KafkaBackend.start_at_timetick``).

Valid data records carry increasing timeticks in offset order; invalid records (landed
elsewhere than expected: their ticks may be anything), barriers, fillers and marks carry
none that counts. A probe at offset ``m`` reads forward from ``m`` to the first valid data
record and takes its tick. The search keeps two bounds:

- every valid record before ``lo`` has a tick below the target (a probe that finds a
  record with a lower tick moves ``lo`` past it);
- no valid record at or after ``hi`` has a tick below the target (a probe from ``m`` that
  finds one with a tick at or above it, or none before ``hi``, moves ``hi`` to ``m``).

When they meet, ``lo`` is exactly the offset after the last valid record below the
target: a read from it passes over nothing but invalid records before the first valid
record at or above the target. Each probe is one fetch (more only across a run of
invalid records), about log2(N) of them. If no probe saw a record at or above the
target (there may be none), the policy starts one record earlier, at the newest valid
record below it, so that a read from it always holds the newest message of the log.
"""

from __future__ import annotations

from walsvc.core._codec import timetick_of
from walsvc.core._deliver import DeliverPolicy

from ._fetch import PartitionFetcher
from ._ids import KafkaMessageId
from ._log import LogReader
from ._options import KafkaOptions
from ._records import data_header

__all__ = ("start_at_timetick",)

_PROBE_WAIT = 0.05


async def start_at_timetick(
    servers: list[str], options: KafkaOptions, reader: LogReader, timetick: int
) -> DeliverPolicy:
    """A deliver policy whose read includes every valid message with a timetick at or
    above ``timetick``: ``all`` if the first retained one qualifies, else ``start_from``
    the offset right after the last valid message below it (that message itself when
    none at or above it was seen)."""
    first, end = await reader.bounds()
    lo, hi = first, end
    above = False  # a probe found a valid record at or above the target
    if lo >= hi:
        return DeliverPolicy.all()
    fetcher = PartitionFetcher(servers, options, reader.tp, first, max_wait=_PROBE_WAIT)
    await fetcher.start()
    try:
        while lo < hi:
            mid = (lo + hi) // 2
            found = await _first_valid(fetcher, mid, hi)
            if found is None or found[1] >= timetick:
                above = above or found is not None
                hi = mid
            else:
                lo = found[0] + 1
    finally:
        await fetcher.aclose()
    if lo == first:
        return DeliverPolicy.all()
    return DeliverPolicy.start_from(KafkaMessageId(lo if above else lo - 1))


async def _first_valid(fetcher: PartitionFetcher, start: int, stop: int) -> tuple[int, int] | None:
    """(offset, timetick) of the first valid data record in ``[start, stop)``, or None."""
    position = start
    while position < stop:
        records, after = await fetcher.read_at(position)
        for offset, head, _ in records:
            if offset >= stop:
                return None
            header = data_header(offset, head)
            if header is not None:
                return offset, timetick_of(header)
        if after <= position:
            return None  # nothing readable here (the end moved back?): no claim on it
        position = after
    return None
