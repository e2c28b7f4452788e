"""Prometheus metrics (issue 24): every metric moves under real load on a real file
log, in this process and on a node process scraped over HTTP, parsed with
prometheus-client's own parser; metrics stay off until enabled; the ``/metrics``
endpoint answers nothing but ``GET /metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _node_process import node_process
from _tcp_proxy import proxied
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import walsvc
import walsvc.metrics
from walsvc import DeliverPolicy, Message
from walsvc.core import _metrics

#: Every sample name the WAL collector exports for a file:// WAL (histograms by their
#: ``_count``), with the labels that pick one series.
WAL_SAMPLES = (
    "walsvc_appended_messages_total",
    "walsvc_append_batch_messages_count",
    "walsvc_append_seconds_count",
    'walsvc_append_stage_seconds_count{stage="chain"}',
    'walsvc_append_stage_seconds_count{stage="encode"}',
    'walsvc_append_stage_seconds_count{stage="commit"}',
    'walsvc_append_stage_seconds_count{stage="ack"}',
    'walsvc_append_errors_total{error="WALFenced"}',
    "walsvc_fenced_appends_total",
    "walsvc_file_commit_seconds_count",
    "walsvc_file_commit_records_count",
    "walsvc_file_written_bytes_total",
    "walsvc_file_segment_rollovers_total",
    "walsvc_last_durable_timetick",
    "walsvc_last_durable_age_seconds",
    "walsvc_consumed_messages_total",
    "walsvc_read_batch_messages_count",
    "walsvc_deliver_seconds_count",
    "walsvc_checkpoint_save_seconds_count",
    "walsvc_scanners",
    "walsvc_tail_cache_messages",
    "walsvc_tail_cache_bytes",
    "walsvc_tail_cache_readers",
    "walsvc_tail_cache_evictions_total",
    "walsvc_tail_cache_pressure",
    'walsvc_subscription_behind_messages{subscription="sub"}',
    'walsvc_subscription_lag_seconds{subscription="sub"}',
    "walsvc_dedup_hits_total",
    "walsvc_txns_begun_total",
    'walsvc_txns_ended_total{outcome="committed"}',
    'walsvc_txns_ended_total{outcome="rolled_back"}',
    'walsvc_txns_ended_total{outcome="expired"}',
)
#: Gauges that may rise and fall: "moving" means changed, for them.
GAUGES = (
    "walsvc_last_durable_age_seconds",
    "walsvc_tail_cache_pressure",
    "walsvc_scanners",
    "walsvc_tail_cache_messages",
    "walsvc_tail_cache_bytes",
    "walsvc_tail_cache_readers",
    "walsvc_subscription_behind_messages",
    "walsvc_subscription_lag_seconds",
)


def samples(text: str, pchannel: str | None = None) -> dict[str, float]:
    """The samples of a scrape, by name and the labels other than pchannel (only those
    of ``pchannel`` when given), parsed by prometheus-client."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if pchannel is not None and labels.pop("pchannel", pchannel) != pchannel:
                continue
            labels.pop("pchannel", None)
            rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            found[f"{sample.name}{{{rest}}}" if rest else sample.name] = sample.value
    return found


def _base(name: str) -> str:
    return name.split("{", 1)[0]


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A registry of its own, with recording on for this test only."""
    registry = CollectorRegistry()
    walsvc.metrics.enable(registry)
    try:
        yield registry
    finally:
        walsvc.metrics.disable(registry)


@contextlib.asynccontextmanager
async def _load(url: str, pchannel: str, **options: Any) -> AsyncIterator[None]:
    """Real work on ``pchannel``: concurrent producers, retried keys, transactions that
    commit, roll back and expire, a subscription that reads and acks, and a newer
    writer that fences this one (a node is the only writer of its pchannels: over
    walsvc:// the second open is one more client of it)."""
    wal = await walsvc.open_wal(url, pchannel, **options)
    scanner = wal.read(DeliverPolicy.all(), subscription="sub", checkpoint_interval=0)
    try:
        await asyncio.gather(
            *(wal.append(Message(payload=b"p" * 100, vchannel=f"v{i % 4}")) for i in range(64))
        )
        keyed = Message(payload=b"k", vchannel="v0", idempotency_key="once")
        first = await wal.append(keyed)
        assert await wal.append(keyed) == first  # answered from the window
        async with wal.txn("v1") as txn:
            await txn.append(Message(payload=b"t", vchannel="v1"))
        rolled_back = await wal.begin_txn("v1")
        await rolled_back.rollback()
        expiring = await wal.begin_txn("v2", keepalive=0.001)
        await asyncio.sleep(0.05)
        await wal.append(Message(payload=b"tick", vchannel="v2"))  # the tick that expires it
        with pytest.raises(walsvc.TxnExpired):
            await expiring.append(Message(payload=b"late", vchannel="v2"))
        received = 0
        async for message in scanner:
            await scanner.ack(message)
            received += 1
            if received == 60:
                break
        await scanner.flush()
        newer = await walsvc.open_wal(url, pchannel)  # fences ``wal`` (not over walsvc://)
        try:
            if not url.startswith("walsvc://"):
                with pytest.raises(walsvc.WALFenced):
                    await wal.append(Message(payload=b"fenced", vchannel="v0"))
            yield
        finally:
            await newer.aclose()
    finally:
        await scanner.aclose()
        await wal.aclose()


async def test_every_metric_moves_under_load_on_a_file_log(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"
    assert "walsvc_appended_messages_total" not in samples(generate_latest(registry).decode())
    # Small segments and a small tail cache: rollovers and evictions under this load.
    async with _load(url, "p0", segment_size=4096, tail_cache_bytes=4096):
        during = samples(generate_latest(registry).decode(), "p0")
    after = samples(generate_latest(registry).decode(), "p0")
    # Both WALs of p0 closed at the end of _load: their figures left with them.
    assert "walsvc_appended_messages_total" not in after
    missing = [s for s in WAL_SAMPLES if s not in during]
    assert missing == []
    still = [s for s in WAL_SAMPLES if _base(s) not in GAUGES if during[s] <= 0]
    assert still == [], "counters that did not count under load"
    assert during["walsvc_appended_messages_total"] >= 64 + 1 + 3 + 1
    assert during["walsvc_dedup_hits_total"] == 1
    assert during["walsvc_txns_begun_total"] == 3
    assert during['walsvc_txns_ended_total{outcome="committed"}'] == 1
    assert during['walsvc_txns_ended_total{outcome="rolled_back"}'] == 1
    assert during['walsvc_txns_ended_total{outcome="expired"}'] == 1
    assert during["walsvc_consumed_messages_total"] >= 60
    assert during["walsvc_scanners"] >= 1  # (and the newer writer's own, rebuilding its window)
    assert during["walsvc_file_segment_rollovers_total"] >= 1  # 4 KiB segments
    assert during["walsvc_file_written_bytes_total"] >= 100 * 64


async def test_a_fenced_append_is_counted_by_type(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"
    wal = await walsvc.open_wal(url, "p1")
    try:
        await wal.append(Message(payload=b"x", vchannel="v"))
        newer = await walsvc.open_wal(url, "p1")
        with pytest.raises(walsvc.WALFenced):
            await wal.append(Message(payload=b"y", vchannel="v"))
        found = samples(generate_latest(registry).decode(), "p1")
        await newer.aclose()
    finally:
        await wal.aclose()
    assert found['walsvc_append_errors_total{error="WALFenced"}'] >= 1
    assert found["walsvc_fenced_appends_total"] >= 1


async def test_metrics_are_off_until_enabled_and_for_wals_opened_before(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    assert not _metrics.recording()
    before = await walsvc.open_wal(f"file://{tmp_path}", "early")
    walsvc.metrics.enable(registry)
    try:
        after = await walsvc.open_wal(f"file://{tmp_path}", "late")
        for wal in (before, after):
            await wal.append(Message(payload=b"x", vchannel="v"))
        text = generate_latest(registry).decode()
        assert samples(text, "late")["walsvc_appended_messages_total"] >= 1  # and TimeTicks
        assert 'pchannel="early"' not in text
        await after.aclose()
    finally:
        walsvc.metrics.disable(registry)
        await before.aclose()
    assert not _metrics.recording()
    assert generate_latest(registry) == b""  # unregistered


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        return answer.read().decode()


async def test_a_node_serves_its_metrics_and_they_move_under_load(tmp_path: Path) -> None:
    with node_process(f"file://{tmp_path}", "--metrics-port", "0") as (url, process):
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        assert line.startswith("walsvc node metrics at http://"), line
        metrics_url = line.rsplit(" at ", 1)[1].strip()
        idle = samples(await asyncio.to_thread(_scrape, metrics_url))
        assert idle["walsvc_node_connections"] == 0
        async with _load(url, "p0"):
            busy = samples(await asyncio.to_thread(_scrape, metrics_url), "p0")
    # The node's WAL, under the load of two clients: every WAL metric is there, and each
    # the load drives has moved (the node's segments are 64 MiB and its cache 64 MiB:
    # no rollover, no eviction; one writer: no fencing).
    missing = [s for s in WAL_SAMPLES if s not in busy and "WALFenced" not in s]
    assert missing == []
    undriven = {
        "walsvc_fenced_appends_total",
        "walsvc_file_segment_rollovers_total",
        "walsvc_tail_cache_evictions_total",
    }
    still = [
        s
        for s in WAL_SAMPLES
        if s not in undriven and "WALFenced" not in s and _base(s) not in GAUGES
        if busy[s] <= 0
    ]
    assert still == [], "counters that did not count under load"
    assert busy["walsvc_dedup_hits_total"] == 1
    assert busy['walsvc_txns_ended_total{outcome="expired"}'] == 1
    assert busy["walsvc_node_connections"] == 2  # the load's two WALs
    assert busy["walsvc_node_streams"] == 1  # its subscription
    assert "walsvc_node_streams_waiting_for_credit" in busy
    assert "walsvc_node_queued_bytes" in busy
    assert busy["walsvc_node_draining"] == 0


async def test_a_client_counts_its_lost_and_restored_connections(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    """``walsvc_client_*``: what a client process of a node exports (the node's own
    scrape has them at 0: it is no client)."""
    before = samples(generate_latest(registry).decode())
    with node_process(f"file://{tmp_path}") as (node_url, _):
        async with proxied(node_url) as (proxy, url), await walsvc.open_wal(url, "p0") as wal:
            await wal.append(Message(payload=b"before", vchannel="v"))
            assert proxy.cut() == 1
            await wal.append(Message(payload=b"after", vchannel="v"))  # over a new connection
    after = samples(generate_latest(registry).decode())
    for name in ("walsvc_client_connections_lost_total", "walsvc_client_reconnects_total"):
        assert after[name] - before[name] >= 1, name


async def test_the_endpoint_answers_only_get_metrics() -> None:
    registry = CollectorRegistry()
    server = await walsvc.metrics.serve_metrics(registry)
    host, port = server.sockets[0].getsockname()[:2]
    base = f"http://{host}:{port}"
    try:
        for path, code in (("/", 404), ("/other", 404)):
            with pytest.raises(urllib.error.HTTPError) as caught:
                await asyncio.to_thread(urllib.request.urlopen, base + path, None, 10)
            assert caught.value.code == code
            caught.value.close()
        request = urllib.request.Request(base + "/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            await asyncio.to_thread(urllib.request.urlopen, request, None, 10)
        assert caught.value.code == 405
        caught.value.close()
        # A peer that sends garbage and no end of headers is cut off, the server goes on.
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\x00" * 9000)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert await asyncio.to_thread(_scrape, base + "/metrics") == ""
    finally:
        server.close()
        await server.wait_closed()


DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "walsvc.json"


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    variables = dashboard["templating"]["list"]
    queries += [v["query"]["query"] for v in variables if isinstance(v.get("query"), dict)]
    return queries


async def test_every_dashboard_query_names_a_metric_walsvc_exports(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    """The names in the dashboard's queries against the names of a real scrape: a WAL
    under load and a node in this process, watched through the same registry."""
    async with walsvc.serve(f"file://{tmp_path / 'node'}", "127.0.0.1:0") as node:
        collector = walsvc.metrics.watch_node(node, registry)
        try:
            async with _load(f"file://{tmp_path / 'log'}", "p0"):
                text = generate_latest(registry).decode()
        finally:
            registry.unregister(collector)
    exported = {sample.split("{", 1)[0] for sample in samples(text)}
    queries = _queries()
    assert len(queries) >= 30
    named = {name for query in queries for name in re.findall(r"\bwalsvc_[a-z_]+", query)}
    assert named, "no query names a walsvc metric"
    assert sorted(named - exported) == []
    for query in queries:  # each query's brackets balance (a cut-off query fails here)
        assert query.count("(") == query.count(")"), query
        assert query.count("{") == query.count("}"), query


def _values(metrics: _metrics.WALMetrics) -> dict[str, Any]:
    """Every public attribute of ``metrics`` but its methods and constants."""
    names = (n for n in dir(metrics) if not n.startswith("_") and n.islower())
    return {n: v for n in names if not callable(v := getattr(metrics, n))}


def test_the_wals_of_one_pchannel_add_up_whatever_they_hold() -> None:
    """``WALMetrics.add`` sums every counter and histogram (a new one not added there
    fails here), and a batch in flight does not disturb it."""
    one, two = _metrics.WALMetrics("p", "file"), _metrics.WALMetrics("p", "file")
    for metrics, k in ((one, 1), (two, 2)):
        for name, value in _values(metrics).items():
            if type(value) is int:
                setattr(metrics, name, k)
            elif isinstance(value, _metrics.Histogram):
                value.observe(0.001 * k, k)
        metrics.failed("WALFenced")
        metrics.batch_started(id(metrics), 1)  # a batch in flight
    counters = [n for n, v in _values(one).items() if type(v) is int]
    assert sorted(counters) == sorted(_metrics.WALMetrics.COUNTERS)
    histograms = [v for v in _values(one).values() if isinstance(v, _metrics.Histogram)]
    assert {id(h) for h in histograms} == {id(h) for h in one.histograms()}
    one.add(two)
    for name, value in _values(one).items():
        if type(value) is int:
            assert value == 3 + (name == "fenced") * 2, name  # failed() counted fencing too
        elif isinstance(value, _metrics.Histogram):
            assert value.counts[-1] + sum(value.counts[:-1]) == 3, name
            assert value.sum == pytest.approx(0.001 + 0.004), name
    assert one.append_errors == {"WALFenced": 2}


def test_the_compiled_histogram_is_built() -> None:
    """``make test`` builds walsvc/core/_cmetrics.c: without it metrics on cost a
    file append about 2% more (issue 24's budget is 3% in all)."""
    assert _metrics.Histogram is not _metrics.PyHistogram


@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.floats(allow_nan=False),
                st.sampled_from(_metrics.LATENCY_BUCKETS),
                st.sampled_from(_metrics.BATCH_BUCKETS),
            ),
            st.integers(min_value=0, max_value=1 << 20),
        ),
        max_size=50,
    ),
    st.sampled_from([_metrics.LATENCY_BUCKETS, _metrics.BATCH_BUCKETS]),
)
def test_the_compiled_histogram_counts_as_the_python_one(
    observations: list[tuple[float, int]], bounds: tuple[float, ...]
) -> None:
    """Bucket by bucket, in count and sum, alone and added to another."""
    compiled, python = _metrics.Histogram(bounds), _metrics.PyHistogram(bounds)
    for value, n in observations:
        compiled.observe(value, n)
        python.observe(value, n)
    compiled.observe(0.5)
    python.observe(0.5)
    assert compiled.bounds == python.bounds
    assert compiled.counts == python.counts
    assert compiled.count == python.count
    assert compiled.sum == python.sum or (math.isnan(compiled.sum) and math.isnan(python.sum))
    assert compiled.cumulative() == python.cumulative()
    total = _metrics.Histogram(bounds)
    total.add(compiled)
    total.add(compiled)
    assert total.counts == [2 * c for c in python.counts]
    with pytest.raises(ValueError, match="same bounds"):
        total.add(_metrics.Histogram((1.0,)))
    with pytest.raises(ValueError, match="ascend"):
        _metrics.Histogram((2.0, 1.0))


def test_histograms_of_many_distinct_bounds_count_alike() -> None:
    """The compiled histograms share the limits of the first few distinct bounds they
    see and own the rest: past that point they count as before."""
    for k in range(1, 13):
        bounds = tuple(float(b) for b in range(k, 3 * k, 2))
        compiled, python = _metrics.Histogram(bounds), _metrics.PyHistogram(bounds)
        for value in (0.5, float(k), k + 0.5, 3.0 * k):
            compiled.observe(value, 2)
            python.observe(value, 2)
        assert compiled.counts == python.counts, bounds
        twin = _metrics.Histogram(bounds)
        twin.add(compiled)
        assert twin.counts == compiled.counts
