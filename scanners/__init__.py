"""Scanner stages: header-only filters for ``WAL.read(filters=[...])``.

Filters read only message headers, never payloads, and compose by conjunction::

    wal.read(filters=[scanners.vchannel("orders"), scanners.types(MessageType.INSERT)])

A message with an empty vchannel (a broadcast) passes every vchannel filter; system
messages (timeticks, transaction control) pass every type filter.

The stages of the read pipeline live here too (``walsvc.Scanner`` composes them): the
write-ahead ``TailCache`` a writer shares with its scanners, the ``ReorderBuffer`` and
the ``TxnBuffer``.
"""

from ._filters import timetick_gt, timetick_gte, types, vchannel
from ._reorder import ReorderBuffer
from ._tail_cache import CacheStats, TailCache
from ._txn_buffer import TxnBuffer

__all__ = (
    "CacheStats",
    "ReorderBuffer",
    "TailCache",
    "TxnBuffer",
    "timetick_gt",
    "timetick_gte",
    "types",
    "vchannel",
)
