"""The Prometheus collectors: walsvc's figures turned into metric families at scrape
time.

``WALCollector`` reads the counters of every live WAL (``walsvc.core._metrics``) and the
gauges of its state then (``WALMetrics.snapshot``); ``NodeCollector`` a node's
connections and streams. Neither keeps anything between scrapes, and both copy the
containers they walk before walking them, so a scrape from another thread (a
``prometheus_client.start_http_server``) never meets one changing under it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Final, Protocol, final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from walsvc.core._metrics import CLIENT, Histogram, WALMetrics, live_metrics
from walsvc.core._timetick import physical_ms

__all__ = ("NodeCollector", "NodeGauges", "WALCollector")

_P: Final = ["pchannel"]


def _counter(name: str, documentation: str, labels: list[str] = _P) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=labels)


def _gauge(name: str, documentation: str, labels: list[str] = _P) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def _histogram(name: str, documentation: str, labels: list[str] = _P) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, documentation, labels=labels)


def _observed(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    family.add_metric(labels, histogram.cumulative(), histogram.sum)


@final
class WALCollector(Collector):
    """Every live WAL's metrics, labelled by pchannel (and subscription, error type,
    stage or transaction outcome where a figure has them)."""

    def collect(self) -> Iterator[Metric]:
        f = _Families()
        by_pchannel: dict[str, list[tuple[WALMetrics, dict[str, Any]]]] = {}
        for metrics in live_metrics():
            snapshot = metrics.snapshot() if metrics.snapshot is not None else None
            if snapshot is not None:  # else closed: its figures leave with it
                by_pchannel.setdefault(metrics.pchannel, []).append((metrics, snapshot))
        for wals in by_pchannel.values():
            f.add(*(wals[0] if len(wals) == 1 else _merged(wals)))
        f.client_reconnects.add_metric([], CLIENT.reconnects)
        f.client_lost.add_metric([], CLIENT.connections_lost)
        f.client_read_again.add_metric([], CLIENT.streams_read_again)
        yield from f.all()


def _merged(wals: list[tuple[WALMetrics, dict[str, Any]]]) -> tuple[WALMetrics, dict[str, Any]]:
    """The WALs of one pchannel open in this process at once (a writer and readers, or
    a writer and the newer one that fenced it) as one: counters summed, the newest
    durable tick, the writers' caches summed (the largest pressure)."""
    first = wals[0][0]
    total = WALMetrics(first.pchannel, first.scheme)
    for metrics, _ in wals:
        total.add(metrics)
    snapshots = [snapshot for _, snapshot in wals]
    ended: dict[str, int] = {}
    for snapshot in snapshots:
        for outcome, count in snapshot["txns_ended"].items():
            ended[outcome] = ended.get(outcome, 0) + count
    return total, {
        "last_durable_timetick": max(s["last_durable_timetick"] for s in snapshots),
        "cache": _merged_caches([s["cache"] for s in snapshots if s["cache"] is not None]),
        "scanners": sum(s["scanners"] for s in snapshots),
        "subscriptions": {k: v for s in snapshots for k, v in s["subscriptions"].items()},
        "dedup_hits": sum(s["dedup_hits"] for s in snapshots),
        "txns_begun": sum(s["txns_begun"] for s in snapshots),
        "txns_ended": ended,
    }


def _merged_caches(caches: list[dict[str, float]]) -> dict[str, float] | None:
    if not caches:
        return None
    total = {key: sum(cache[key] for cache in caches) for key in caches[0]}
    total["pressure"] = max(cache["pressure"] for cache in caches)
    return total


class _Families:
    """The metric families of one scrape, filled WAL by WAL."""

    def __init__(self) -> None:
        self.appended = _counter("walsvc_appended_messages", "Messages made durable.")
        self.batches = _histogram(
            "walsvc_append_batch_messages", "Messages per batch handed to the backend."
        )
        self.append_seconds = _histogram(
            "walsvc_append_seconds",
            "Time to append: a coalesced batch from its start down the interceptor chain"
            " to its answer, once per message.",
        )
        self.stages = _histogram(
            "walsvc_append_stage_seconds",
            "An append's stages, per batch: chain (the interceptors, down and back up),"
            " encode (ticks, envelopes, hand-off to the backend), commit (until the backend"
            " acknowledged), ack (from the acknowledgement to the answers).",
            ["pchannel", "stage"],
        )
        self.errors = _counter(
            "walsvc_append_errors", "Appends that failed, by error type.", ["pchannel", "error"]
        )
        self.fenced = _counter(
            "walsvc_fenced_appends", "Appends refused because a newer writer fenced this one."
        )
        self.commit_seconds = _histogram(
            "walsvc_file_commit_seconds",
            "file://: one group commit, write and fdatasync, from its hand-off to its thread"
            " to its completion.",
        )
        self.commit_records = _histogram(
            "walsvc_file_commit_records", "file://: records per group commit."
        )
        self.written = _counter("walsvc_file_written_bytes", "file://: bytes written.")
        self.rollovers = _counter("walsvc_file_segment_rollovers", "file://: segments started.")
        self.durable_tick = _gauge(
            "walsvc_last_durable_timetick", "Timetick of the newest durable message."
        )
        self.durable_age = _gauge(
            "walsvc_last_durable_age_seconds",
            "Wall clock now less the time in the newest durable message's timetick.",
        )
        self.consumed = _counter("walsvc_consumed_messages", "Messages handed to readers.")
        self.read_batches = _histogram(
            "walsvc_read_batch_messages", "Messages per batch handed to a reader."
        )
        self.deliver_seconds = _histogram(
            "walsvc_deliver_seconds",
            "Time to deliver: from a message's timetick (its append) to its hand-off to a"
            " reader, once per message.",
        )
        self.checkpoint_seconds = _histogram(
            "walsvc_checkpoint_save_seconds", "Time to write a subscription checkpoint."
        )
        self.scanners = _gauge("walsvc_scanners", "Scanners reading the WAL.")
        self.cache_messages = _gauge("walsvc_tail_cache_messages", "Messages in the tail cache.")
        self.cache_bytes = _gauge("walsvc_tail_cache_bytes", "Bytes in the tail cache.")
        self.cache_readers = _gauge(
            "walsvc_tail_cache_readers", "Scanners reading from the tail cache."
        )
        self.cache_pressure = _gauge(
            "walsvc_tail_cache_pressure",
            "The largest share of the cache still ahead of a reader (1: the next eviction"
            " sends a reader to the backend).",
        )
        self.cache_evictions = _counter(
            "walsvc_tail_cache_evictions", "Messages evicted from the tail cache."
        )
        self.behind = _gauge(
            "walsvc_subscription_behind_messages",
            "Messages in the log after a subscription scanner's position (sequence-id"
            " backends: memory, file, kafka).",
            ["pchannel", "subscription"],
        )
        self.lag = _gauge(
            "walsvc_subscription_lag_seconds",
            "Time between the newest durable message's timetick and the subscription's"
            " checkpoint's.",
            ["pchannel", "subscription"],
        )
        self.dedup_hits = _counter(
            "walsvc_dedup_hits", "Keyed appends answered from the dedup window."
        )
        self.txns_begun = _counter("walsvc_txns_begun", "Transactions begun.")
        self.txns_ended = _counter(
            "walsvc_txns_ended",
            "Transactions ended, by outcome (committed, rolled_back, expired, unresolved).",
            ["pchannel", "outcome"],
        )
        self.client_reconnects = _counter(
            "walsvc_client_reconnects", "walsvc:// connections restored after a loss.", []
        )
        self.client_lost = _counter(
            "walsvc_client_connections_lost", "walsvc:// connections lost while open.", []
        )
        self.client_read_again = _counter(
            "walsvc_client_streams_read_again",
            "walsvc:// streams a node ended while it stayed up, read again.",
            [],
        )

    def add(self, m: WALMetrics, snapshot: dict[str, Any]) -> None:
        p = [m.pchannel]
        self.appended.add_metric(p, m.append_messages)
        _observed(self.batches, p, m.append_batches)
        _observed(self.append_seconds, p, m.append_seconds)
        _observed(self.stages, [m.pchannel, "chain"], m.chain_seconds)
        _observed(self.stages, [m.pchannel, "encode"], m.encode_seconds)
        _observed(self.stages, [m.pchannel, "commit"], m.stage_commit_seconds)
        _observed(self.stages, [m.pchannel, "ack"], m.ack_seconds)
        for error, count in list(m.append_errors.items()):
            self.errors.add_metric([m.pchannel, error], count)
        self.fenced.add_metric(p, m.fenced)
        if m.scheme == "file":
            _observed(self.commit_seconds, p, m.commit_seconds)
            _observed(self.commit_records, p, m.commit_records)
            self.written.add_metric(p, m.written_bytes)
            self.rollovers.add_metric(p, m.segment_rollovers)
        tick = snapshot["last_durable_timetick"]
        now_ms = time.time() * 1000.0
        if tick >= 0:
            self.durable_tick.add_metric(p, tick)
            self.durable_age.add_metric(p, max(now_ms - physical_ms(tick), 0.0) / 1000.0)
        self.consumed.add_metric(p, m.consumed_messages)
        _observed(self.read_batches, p, m.read_batches)
        _observed(self.deliver_seconds, p, m.deliver_seconds)
        _observed(self.checkpoint_seconds, p, m.checkpoint_seconds)
        self.scanners.add_metric(p, snapshot["scanners"])
        cache = snapshot["cache"]
        if cache is not None:
            self.cache_messages.add_metric(p, cache["messages"])
            self.cache_bytes.add_metric(p, cache["bytes"])
            self.cache_readers.add_metric(p, cache["readers"])
            self.cache_pressure.add_metric(p, cache["pressure"])
            self.cache_evictions.add_metric(p, cache["evicted"])
        for name, subscription in snapshot["subscriptions"].items():
            labels = [m.pchannel, name]
            if subscription["behind_messages"] is not None:
                self.behind.add_metric(labels, subscription["behind_messages"])
            checkpoint_tick = subscription["checkpoint_timetick"]
            if checkpoint_tick is not None and tick >= 0:
                lag_ms = physical_ms(tick) - physical_ms(checkpoint_tick)
                self.lag.add_metric(labels, max(lag_ms, 0) / 1000.0)
        self.dedup_hits.add_metric(p, snapshot["dedup_hits"])
        self.txns_begun.add_metric(p, snapshot["txns_begun"])
        for outcome, count in snapshot["txns_ended"].items():
            self.txns_ended.add_metric([m.pchannel, outcome], count)

    def all(self) -> list[Metric]:
        return [v for v in vars(self).values() if isinstance(v, Metric)]


class NodeGauges(Protocol):
    """A node as ``NodeCollector`` reads it (``walsvc.service.NodeServer``)."""

    def gauges(self) -> dict[str, float]: ...


@final
class NodeCollector(Collector):
    """One node's connections, streams and pressure (``NodeServer.gauges``)."""

    def __init__(self, node: NodeGauges) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        g = self._node.gauges()
        gauges = {
            "connections": "Client connections past their handshake.",
            "streams": "Read streams open on the node.",
            "streams_waiting_for_credit": (
                "Streams the node holds back until their reader grants credit (pressure)."
            ),
            "requests_in_flight": "Client requests the node is working on.",
            "queued_bytes": "Bytes queued for clients and not yet taken by them.",
            "draining": "1 while the node drains (SIGTERM), else 0.",
        }
        for key, documentation in gauges.items():
            family = GaugeMetricFamily(f"walsvc_node_{key}", documentation)
            family.add_metric([], g[key])
            yield family
        refused = CounterMetricFamily(
            "walsvc_node_refused_peers", "Peers disconnected for breaking the protocol."
        )
        refused.add_metric([], g["refused_peers"])
        yield refused
