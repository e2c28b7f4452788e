"""A WAL's gauges at scrape time: what ``walsvc.metrics`` reads from the WAL's own
state when Prometheus asks, so that none of it costs anything between scrapes.

``gauges_of`` returns, for one open ``LocalWAL``: the timetick of its newest durable
message, its tail cache (from ``CacheStats``: messages, bytes, readers, pressure,
evictions; None on a read-only WAL), how many scanners read it, each durable
subscription's checkpoint and how far it is behind, and the counters its interceptors
keep (dedup hits, transactions begun and ended). It reads memory only: no I/O, no
await, a few microseconds per scanner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from interceptors import Dedup, Transactions
from walsvc.core._ids import SequenceMessageId

if TYPE_CHECKING:
    from ._wal import LocalWAL

__all__ = ("gauges_of",)


def gauges_of(wal: LocalWAL) -> dict[str, Any]:
    """The gauges of ``wal`` now (see the module docs): a dict of plain values."""
    latest = wal.last_durable
    subscriptions: dict[str, dict[str, Any]] = {}
    for name, stats in wal.subscription_stats():
        checkpoint = stats.checkpoint
        behind: int | None = None
        if isinstance(latest[0], SequenceMessageId) and isinstance(
            stats.position, SequenceMessageId
        ):
            behind = max(latest[0].seq - stats.position.seq, 0)
        subscriptions[name] = {
            "checkpoint_timetick": None if checkpoint is None else checkpoint.timetick,
            "behind_messages": behind,
        }
    dedup_hits = 0
    txns_begun, txns_ended = 0, {}
    for member in wal.interceptors:
        if isinstance(member, Dedup):
            dedup_hits += member.hits
        elif isinstance(member, Transactions):
            txns_begun, txns_ended = member.begun, dict(member.ended)
    cached = wal.cache_stats()
    cache = None
    if cached is not None:
        cache = {
            "messages": cached.messages,
            "bytes": cached.bytes,
            "readers": cached.readers,
            "pressure": cached.pressure,
            "evicted": cached.evicted,
        }
    return {
        "last_durable_timetick": latest[1],
        "cache": cache,
        "scanners": wal.scanner_count,
        "subscriptions": subscriptions,
        "dedup_hits": dedup_hits,
        "txns_begun": txns_begun,
        "txns_ended": txns_ended,
    }
