"""The ``walsvc`` Spark data source, read side, on a real local SparkSession: batch reads
equal what ``WAL.read`` delivers (file, Kafka, Pulsar), id-range partitions tile a
pchannel exactly, filters (options and pushed down) mean what they say, and streaming
micro-batches deliver every committed message exactly once across restarts."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _pulsar_lite import PulsarLite, broker
from _pulsar_lite import pchannel as pulsar_pchannel
from _spark import append_messages, read_all, spark
from _tansu import fresh, tansu_url

import walsvc
from walsvc import Filter, ImmutableMessage, Message, MessageType
from walsvc.spark import IdRange, RangeStalled, SourceOptions
from walsvc.spark._batch import read_partition
from walsvc.spark._ranges import split_range, tile
from walsvc.spark._stream import share_out

# Fixtures imported from the helper modules (pytest finds them by name here).
__all__ = ("broker", "spark", "tansu_url")

Row = tuple[str, int, str, int, dict[str, str], bytes, int | None]


async def fill(url: str, pchannel: str, rounds: int = 4, **options: Any) -> None:
    """A log with what a reader must get right: three vchannels and broadcasts, message
    properties and application types, committed transactions interleaved with plain
    appends, a rolled-back transaction, and a transaction still open at the end."""
    async with await walsvc.open_wal(url, pchannel, **options) as wal:
        for r in range(rounds):
            await wal.append_many(
                Message(
                    payload=f"r{r}-{i}".encode(),
                    vchannel=f"v{i % 3}" if i % 7 else "",
                    properties={"i": str(i)} if i % 4 == 0 else {},
                )
                for i in range(40)
            )
            committed = await wal.begin_txn("v1")
            await committed.append(Message(payload=f"txn{r}-a".encode(), vchannel="v1"))
            await wal.append(Message(payload=f"between{r}".encode(), vchannel="v2", type=10001))
            await committed.append(Message(payload=f"txn{r}-b".encode(), vchannel="v1"))
            await committed.commit()
            doomed = await wal.begin_txn("v2")
            await doomed.append(Message(payload=f"gone{r}".encode(), vchannel="v2"))
            await doomed.rollback()
        still_open = await wal.begin_txn("v0")
        await still_open.append(Message(payload=b"never committed", vchannel="v0"))
        await wal.append(Message(payload=b"last", vchannel="v0"))


def expected_rows(delivered: list[ImmutableMessage]) -> list[Row]:
    """The rows a reader of ``delivered`` (WAL.read output) should get, in order: the
    bodies of each committed transaction at its commit's timetick; no TimeTicks."""
    rows: list[Row] = []
    for m in delivered:
        if m.type == MessageType.TXN:
            rows += [
                (
                    b.message_id.marshal(),
                    m.timetick,
                    b.vchannel,
                    int(b.type),
                    dict(b.properties),
                    b.payload,
                    b.txn.txn_id if b.txn else None,
                )
                for b in m.body
            ]
        elif m.type != MessageType.TIME_TICK:
            rows.append(
                (
                    m.message_id.marshal(),
                    m.timetick,
                    m.vchannel,
                    int(m.type),
                    dict(m.properties),
                    m.payload,
                    None,
                )
            )
    return rows


def spark_rows(df: Any) -> list[Row]:
    return [
        (
            r.message_id,
            r.timetick,
            r.vchannel,
            r.type,
            dict(r.properties),
            bytes(r.payload),
            r.txn_id,
        )
        for r in df.collect()
    ]


def load(spark: Any, url: str, pchannels: str, **options: str) -> Any:
    reader = spark.read.format("walsvc").option("url", url).option("pchannels", pchannels)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# -- batch reads ---------------------------------------------------------------------------


def test_a_batch_read_equals_what_the_scanner_delivers(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "p0"))
    expected = expected_rows(read_all(url, "p0"))
    assert any(row[-1] is not None for row in expected)  # committed txn bodies are rows
    assert not any(row[5].startswith(b"gone") or row[5] == b"never committed" for row in expected)

    df = load(spark, url, "p0")
    assert df.rdd.getNumPartitions() == 1
    assert spark_rows(df) == expected
    assert {r.pchannel for r in df.select("pchannel").collect()} == {"p0"}


def test_id_range_partitions_tile_a_pchannel_exactly(spark: Any, tmp_path: Path) -> None:
    """Ranges of 7 ids cut through transactions: each committed transaction still comes
    once, from the range that holds its commit."""
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "p0"))
    expected = expected_rows(read_all(url, "p0"))
    df = load(spark, url, "p0", maxRecordsPerPartition="7")
    assert df.rdd.getNumPartitions() > 20
    assert spark_rows(df) == expected
    df = load(spark, url, "p0", minPartitions="5")
    assert df.rdd.getNumPartitions() >= 5
    assert spark_rows(df) == expected


def test_several_pchannels_read_in_parallel(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    for p in ("a", "b", "c"):
        asyncio.run(fill(url, p, rounds=1))
    df = load(spark, url, "a, b,c", maxRecordsPerPartition="50")
    by_pchannel = Counter(r.pchannel for r in df.select("pchannel").collect())
    for p in ("a", "b", "c"):
        assert by_pchannel[p] == len(expected_rows(read_all(url, p)))
    assert df.rdd.getNumPartitions() >= 3


def test_a_pchannel_without_data_has_no_rows_and_a_missing_one_is_an_error(
    spark: Any, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "full", rounds=1))
    append_messages(url, "quiet", [])  # opened read-write: only its opening TimeTick
    assert load(spark, url, "quiet").count() == 0
    assert load(spark, url, "full,quiet").where("pchannel = 'quiet'").count() == 0
    with pytest.raises(Exception, match="no file WAL for pchannel 'typo'"):
        load(spark, url, "full,typo").collect()


@pytest.mark.parametrize(
    ("options", "walsvc_filter"),
    [
        ({"vchannels": "v1"}, Filter(vchannels=["v1"])),
        ({"types": "INSERT"}, Filter(types=[MessageType.INSERT])),
        ({"types": "10001, 2"}, Filter(types=[10001, 2])),
        ({"vchannels": "v0,v2", "types": "10001"}, Filter(vchannels=["v0", "v2"], types=[10001])),
    ],
)
def test_filter_options_mean_what_walsvc_filters_mean(
    spark: Any, tmp_path: Path, options: dict[str, str], walsvc_filter: Filter
) -> None:
    """``vchannels``/``types`` are walsvc filters: broadcasts pass vchannel filters, and a
    transaction's bodies are filtered one by one, exactly as ``WAL.read`` does."""
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "p0"))
    expected = expected_rows(read_all(url, "p0", [walsvc_filter]))
    assert expected
    assert spark_rows(load(spark, url, "p0", maxRecordsPerPartition="9", **options)) == expected


def test_timetick_options_bound_the_rows(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "p0"))
    everything = expected_rows(read_all(url, "p0"))
    ticks = sorted({row[1] for row in everything})
    low, high = ticks[len(ticks) // 4], ticks[3 * len(ticks) // 4]
    rows = spark_rows(
        load(
            spark,
            url,
            "p0",
            timetickFrom=str(low),
            timetickTo=str(high),
            maxRecordsPerPartition="11",
        )
    )
    assert rows == [row for row in everything if low <= row[1] <= high]


def test_pushed_down_filters_keep_their_sql_meaning(spark: Any, tmp_path: Path) -> None:
    """Spark does not re-check filters a source accepts, so a pushed ``vchannel = 'v1'``
    must leave out broadcast rows (which the walsvc ``vchannels`` option keeps)."""
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "p0"))
    everything = expected_rows(read_all(url, "p0"))
    df = load(spark, url, "p0", maxRecordsPerPartition="13")
    ticks = sorted({row[1] for row in everything})
    middle = ticks[len(ticks) // 2]

    def where(condition: str) -> list[Row]:
        return spark_rows(df.where(condition))

    assert where("vchannel = 'v1'") == [r for r in everything if r[2] == "v1"]
    assert where("vchannel in ('v0', '')") == [r for r in everything if r[2] in ("v0", "")]
    assert where("type = 10001") == [r for r in everything if r[3] == 10001]
    assert where(f"timetick > {middle}") == [r for r in everything if r[1] > middle]
    assert where(f"timetick <= {middle} and vchannel = 'v2'") == [
        r for r in everything if r[1] <= middle and r[2] == "v2"
    ]
    assert where("txn_id is not null") == [r for r in everything if r[-1] is not None]
    plan = df.where("vchannel = 'v1'")._jdf.queryExecution().optimizedPlan().toString()
    assert "Filter" not in plan  # accepted by the source, not re-applied by Spark


def test_start_after_reads_only_what_follows(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    asyncio.run(fill(url, "p0"))
    everything = expected_rows(read_all(url, "p0"))
    start = everything[len(everything) // 3][0]
    rows = spark_rows(load(spark, url, "p0", startAfter=json.dumps({"p0": start})))
    assert rows == everything[len(everything) // 3 + 1 :]


def test_payloads_keep_their_bytes_and_size(spark: Any, tmp_path: Path) -> None:
    """Empty, binary and large (1 MiB) payloads survive the Arrow path unchanged."""
    url = f"file://{tmp_path}"
    payloads = [b"", bytes(range(256)), b"\x00" * 3, bytes(1 << 20), b"tail"]
    append_messages(url, "p0", [Message(payload=p, vchannel="v") for p in payloads])
    rows = load(spark, url, "p0", rowsPerBatch="2").select("payload").collect()
    assert [bytes(r.payload) for r in rows] == payloads


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"pchannels": "p0"}, "'url' is required"),
        ({"url": "FILE"}, "'pchannels' is required"),
        ({"url": "FILE", "pchannels": "p0", "vchanels": "v1"}, "unknown walsvc data source option"),
        ({"url": "nosuch://x", "pchannels": "p0"}, "nosuch"),
        ({"url": "memory://x", "pchannels": "p0"}, "memory:// WAL lives in one process"),
        ({"url": "FILE", "pchannels": "p0", "types": "INSRT"}, "INSRT"),
        ({"url": "FILE", "pchannels": "p0", "startAfter": "{"}, "not JSON"),
        ({"url": "FILE", "pchannels": "p0", "startAfter": '{"p0": "file:x"}'}, "bad message id"),
        ({"url": "FILE", "pchannels": "p0", "maxRecordsPerPartition": "0"}, "at least 1"),
    ],
)
def test_bad_options_fail_with_a_clear_error(
    spark: Any, tmp_path: Path, options: dict[str, str], complaint: str
) -> None:
    url = f"file://{tmp_path}"
    append_messages(url, "p0", [Message(payload=b"x", vchannel="v")])
    reader = spark.read.format("walsvc")
    for key, value in options.items():
        reader = reader.option(key, value.replace("FILE", url))
    with pytest.raises(Exception, match=complaint) as raised:
        reader.load().collect()
    assert "InvalidArgument" in str(raised.value) or "UnknownBackend" in str(raised.value)


def test_a_range_past_the_end_of_the_log_fails_instead_of_hanging(tmp_path: Path) -> None:
    """A range planned before the log was cut short (here: one naming an id never
    written) raises ``RangeStalled`` after ``stallTimeout``, not a hang."""
    url = f"file://{tmp_path}"
    append_messages(url, "p0", [Message(payload=b"x", vchannel="v")] * 3)
    options = SourceOptions(url=url, pchannels=("p0",), stall_timeout=0.5)
    with pytest.raises(RangeStalled, match="stallTimeout"):
        list(read_partition(options, IdRange("p0", None, "file:99")))


def test_split_range_cuts_sequence_ids_and_keeps_others_whole() -> None:
    whole = IdRange("p0", "file:10", "file:35")
    parts = split_range(whole, 10)
    assert [(p.after, p.end) for p in parts] == [
        ("file:10", "file:20"),
        ("file:20", "file:30"),
        ("file:30", "file:35"),
    ]
    assert [(p.after, p.end) for p in split_range(IdRange("p0", None, "file:4"), 3)] == [
        (None, "file:2"),
        ("file:2", "file:4"),
    ]


def test_min_partitions_cuts_ranges_finer_where_ids_can_be_counted() -> None:
    wholes = [IdRange("a", None, "file:99"), IdRange("b", "file:10", "file:19")]
    options = SourceOptions(url="file:///x", pchannels=("a", "b"), min_partitions=11)
    parts = tile(wholes, options)
    assert len(parts) >= 11
    assert all(_ids(p) <= 10 for p in parts)  # 109 ids over at least 11 ranges
    assert sum(_ids(p) for p in parts) == 109
    few = SourceOptions(url="file:///x", pchannels=("a", "b"), records_per_partition=60)
    assert [_ids(p) for p in tile(wholes, few)] == [60, 40, 9]


def _ids(part: IdRange) -> int:
    after, end = part.bounds()
    return end.seq - (-1 if after is None else after.seq)  # type: ignore[attr-defined]


def test_share_out_bounds_a_micro_batch_fairly() -> None:
    start = {"a": None, "b": "file:100", "c": "file:5"}
    ends = {"a": "file:999", "b": "file:103", "c": "file:5"}
    shared = share_out(start, ends, 50)
    # b needs 3, a gets the rest; c has nothing new.
    assert shared == {"a": "file:46", "b": "file:103", "c": "file:5"}
    assert share_out(start, ends, 2) == {"a": "file:0", "b": "file:101", "c": "file:5"}
    assert share_out(start, ends, 10_000) == ends


# -- brokers -------------------------------------------------------------------------------


def test_a_batch_read_equals_the_scanner_on_kafka(spark: Any, tansu_url: str) -> None:
    pchannel = fresh()
    asyncio.run(fill(tansu_url, pchannel, rounds=2))
    expected = expected_rows(read_all(tansu_url, pchannel))
    assert len(expected) > 80
    assert spark_rows(load(spark, tansu_url, pchannel, maxRecordsPerPartition="17")) == expected


def test_a_batch_read_equals_the_scanner_on_pulsar(spark: Any, broker: PulsarLite) -> None:
    pchannel = pulsar_pchannel()
    asyncio.run(fill(broker.url, pchannel, rounds=2))
    expected = expected_rows(read_all(broker.url, pchannel))
    assert len(expected) > 80
    df = load(spark, broker.url, pchannel, maxRecordsPerPartition="17")
    assert df.rdd.getNumPartitions() == 1  # Pulsar ids are not counted: one range
    assert spark_rows(df) == expected


# -- streaming -----------------------------------------------------------------------------


def run_stream(spark: Any, url: str, pchannels: str, out: Path, **options: str) -> None:
    """One ``Trigger.AvailableNow`` run of a stream into Parquet at ``out`` (with its
    checkpoint beside it), to completion."""
    reader = spark.readStream.format("walsvc").option("url", url).option("pchannels", pchannels)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(240)
    finally:
        query.stop()
    assert query.exception() is None


def streamed_rows(spark: Any, out: Path) -> list[Row]:
    df = spark.read.parquet(str(out / "data"))
    return sorted(spark_rows(df), key=lambda r: (r[1], int(r[0].split(":")[1])))


def test_a_stream_delivers_each_committed_message_exactly_once_across_restarts(
    spark: Any, tmp_path: Path
) -> None:
    """Micro-batches of at most 23 records cut through transactions; a restarted query
    (same checkpoint) picks up exactly where the last one stopped, including a
    transaction that was open at that point and committed later."""
    url = f"file://{tmp_path / 'wal'}"
    out = tmp_path / "out"
    asyncio.run(fill(url, "p0", rounds=2))
    run_stream(spark, url, "p0", out, maxRecordsPerTrigger="23")
    progress = Counter(str(p) for p in (out / "checkpoint" / "offsets").iterdir())
    assert len(progress) > 4  # many micro-batches
    first = expected_rows(read_all(url, "p0"))
    assert streamed_rows(spark, out) == sorted(first, key=lambda r: (r[1], int(r[0].split(":")[1])))

    async def more() -> None:
        async with await walsvc.open_wal(url, "p0") as wal:
            await wal.append_many(Message(payload=b"more%d" % i, vchannel="v2") for i in range(30))

    asyncio.run(more())
    asyncio.run(fill(url, "p0", rounds=1))
    run_stream(spark, url, "p0", out, maxRecordsPerTrigger="23")
    everything = expected_rows(read_all(url, "p0"))
    assert len(everything) > len(first)
    assert streamed_rows(spark, out) == sorted(
        everything, key=lambda r: (r[1], int(r[0].split(":")[1]))
    )


def test_a_stream_starts_after_the_given_ids(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'wal'}"
    asyncio.run(fill(url, "p0", rounds=1))
    everything = expected_rows(read_all(url, "p0"))
    start = everything[10][0]
    run_stream(spark, url, "p0", tmp_path / "out", startAfter=json.dumps({"p0": start}))
    assert [r[0] for r in streamed_rows(spark, tmp_path / "out")] == [r[0] for r in everything[11:]]


def test_read_range_delivers_transactions_open_at_its_start(tmp_path: Path) -> None:
    """The range after a BeginTxn still delivers the transaction (read from the
    last-confirmed id), and the range before its commit does not."""
    url = f"file://{tmp_path}"

    async def write() -> tuple[str, str, str]:
        async with await walsvc.open_wal(url, "p0") as wal:
            txn = await wal.begin_txn("v")
            body = await txn.append(Message(payload=b"body", vchannel="v"))
            plain = await wal.append(Message(payload=b"plain", vchannel="v"))
            commit = await txn.commit()
            return (
                body.message_id.marshal(),
                plain.message_id.marshal(),
                commit.message_id.marshal(),
            )

    body, plain, commit = asyncio.run(write())
    options = SourceOptions(url=url, pchannels=("p0",))

    def payloads(after: str | None, end: str) -> list[bytes]:
        from walsvc.spark._rows import COLUMNS

        batches = list(read_partition(options, IdRange("p0", after, end)))
        index = COLUMNS.index("payload")
        return [bytes(v.as_py()) for b in batches for v in b.column(index)]

    assert payloads(None, plain) == [b"plain"]
    assert payloads(plain, commit) == [b"body"]
    assert payloads(body, commit) == [b"plain", b"body"]
