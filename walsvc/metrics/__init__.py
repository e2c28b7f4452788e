"""Prometheus metrics for walsvc (the ``metrics`` extra: ``prometheus-client``).

Off by default: ``enable()`` turns recording on for every WAL opened from then on and
registers the collectors (``walsvc serve --metrics-port`` does both, and serves
``/metrics``). A WAL records per batch, in plain ints, and the collectors read those
and the WALs' state only when scraped. Names follow Prometheus's conventions (counters
end in ``_total``, base units ``_seconds`` and ``_bytes``); labels are bounded
(``pchannel``, ``subscription``, error type, stage, transaction outcome; never a
vchannel or a message id). The metrics: docs/metrics.md.
"""

from __future__ import annotations

from prometheus_client import REGISTRY as _DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry

from walsvc.core._metrics import start_recording, stop_recording

from ._collector import NodeCollector, NodeGauges, WALCollector
from ._http import serve_metrics

__all__ = ("REGISTRY", "disable", "enable", "serve_metrics", "watch_node")

#: prometheus-client's global registry, the default of ``enable`` (what
#: ``prometheus_client.start_http_server`` and ``walsvc serve --metrics-port`` export).
REGISTRY: CollectorRegistry = _DEFAULT_REGISTRY

_registered: dict[int, WALCollector] = {}


def enable(registry: CollectorRegistry = REGISTRY) -> None:
    """Record metrics for every WAL opened from now on, and export them through
    ``registry`` (default: prometheus-client's global one). WALs opened before keep
    recording nothing. Idempotent per registry."""
    start_recording()
    if id(registry) not in _registered:
        collector = WALCollector()
        registry.register(collector)
        _registered[id(registry)] = collector


def disable(registry: CollectorRegistry = REGISTRY) -> None:
    """Stop recording for WALs opened from now on, and stop exporting through
    ``registry`` (open WALs keep counting until closed, unseen)."""
    stop_recording()
    collector = _registered.pop(id(registry), None)
    if collector is not None:
        registry.unregister(collector)


def watch_node(node: NodeGauges, registry: CollectorRegistry = REGISTRY) -> NodeCollector:
    """Export ``node``'s connections, streams and pressure (a ``walsvc.serve`` node's
    ``NodeServer``) through ``registry``; unregister the returned collector to stop."""
    collector = NodeCollector(node)
    registry.register(collector)
    return collector
