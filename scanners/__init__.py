"""Scanner stages: header-only filters for ``WAL.read(filters=[...])``.

Filters read only message headers, never payloads, and compose by conjunction::

    wal.read(filters=[scanners.vchannel("orders"), scanners.types(MessageType.INSERT)])

A message with an empty vchannel (a broadcast) passes every vchannel filter; system
messages (timeticks, transaction control) pass every type filter.
"""

from ._filters import timetick_gt, timetick_gte, types, vchannel

__all__ = ("timetick_gt", "timetick_gte", "types", "vchannel")
