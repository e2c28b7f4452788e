"""The ``walsvc`` Spark data source, write side, on a real local SparkSession: rows land
in the WAL exactly once through the interceptor chain (timeticks, idempotency keys), also
when a task fails midway and Spark retries it, when tasks fence each other on one
pchannel, and when a streaming micro-batch is run again after a restart; bad writes are
refused on the driver with typed errors."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _spark import read_all, spark
from _tansu import fresh, tansu_url

import interceptors
import walsvc
from walsvc import ImmutableMessage, MessageType
from walsvc.spark import _options
from walsvc.spark._writer import _Appender, plan_write, stream_producer

# Fixtures imported from the helper modules (pytest finds them by name here).
__all__ = ("spark", "tansu_url")

SCHEMA = "vchannel string, payload binary, type int, properties map<string,string>"
HANG = 60.0  # a guard against hangs inside Spark tasks, never an assertion about speed


def rows(partition: int, count: int) -> list[tuple[Any, ...]]:
    """Rows whose payload names them (``b"<partition>-<i>"``), with every vchannel, some
    properties, null properties and null types, DELETE and an application type."""
    out: list[tuple[Any, ...]] = []
    for i in range(count):
        kind = (None, 2, 3, 10001)[i % 4]
        properties = {"i": str(i), "p": str(partition)} if i % 3 else None
        out.append((f"v{i % 3}", f"{partition}-{i}".encode(), kind, properties))
    return out


def frame(spark: Any, partitions: list[list[tuple[Any, ...]]], schema: str = SCHEMA) -> Any:
    """A DataFrame whose partition ``k`` holds exactly ``partitions[k]``, in order."""
    count = len(partitions)
    rdd = spark.sparkContext.parallelize(range(count), count).flatMap(lambda k: partitions[k])
    return spark.createDataFrame(rdd, schema)


def write(df: Any, url: str, pchannel: str, **options: Any) -> None:
    writer = df.write.format("walsvc").mode("append").option("url", url)
    writer = writer.option("pchannel", pchannel)
    for key, value in options.items():
        writer = writer.option(key, str(value))
    writer.save()


def data_of(delivered: list[ImmutableMessage]) -> list[ImmutableMessage]:
    return [m for m in delivered if m.type is not MessageType.TIME_TICK]


def check_exactly_once(delivered: list[ImmutableMessage], written: list[tuple[Any, ...]]) -> None:
    """Every written row is in the log once, with its vchannel, type and properties; the
    log's timeticks increase; every row carries its own idempotency key."""
    ticks = [m.timetick for m in delivered]
    assert ticks == sorted(ticks)
    assert len(set(ticks)) == len(ticks)
    data = data_of(delivered)
    counts = Counter(m.payload for m in data)
    assert {p: n for p, n in counts.items() if n > 1} == {}, "duplicated rows"
    assert set(counts) == {row[1] for row in written}, "missing or unexpected rows"
    by_payload = {m.payload: m for m in data}
    for vchannel, payload, kind, properties in written:
        m = by_payload[payload]
        assert (m.vchannel, int(m.type), dict(m.properties)) == (
            vchannel,
            2 if kind is None else kind,
            properties or {},
        )
    keys = [m.idempotency_key for m in data]
    assert None not in keys
    assert len(set(keys)) == len(keys)


def test_write_options_defaults_match_dedup() -> None:
    assert _options.DEFAULT_DEDUP_MAX_KEYS == interceptors.DEFAULT_MAX_KEYS
    assert _options.DEFAULT_DEDUP_MAX_AGE == interceptors.DEFAULT_MAX_AGE


def test_round_trip_and_copy_between_wals(spark: Any, tmp_path: Path) -> None:
    """Three partitions into one pchannel; then the pchannel read back by Spark (system
    columns included) and written to another WAL, which ends up with the same rows."""
    url = f"file://{tmp_path}"
    parts = [rows(p, 60) for p in range(3)]
    write(frame(spark, parts), url, "p0", appendBatch=16)
    delivered = read_all(url, "p0")
    written = [row for part in parts for row in part]
    check_exactly_once(delivered, written)
    # Within a partition, rows keep their order in the log.
    for p in range(3):
        mine = [m.payload for m in data_of(delivered) if m.payload.startswith(b"%d-" % p)]
        assert mine == [row[1] for row in parts[p]]

    copied = spark.read.format("walsvc").option("url", url).option("pchannels", "p0").load()
    assert "timetick" in copied.columns
    write(copied, url, "copy", writeId="copy-1")
    again = read_all(url, "copy")
    check_exactly_once(again, written)
    assert all(str(m.idempotency_key).startswith("copy-1/") for m in data_of(again))


def test_failed_task_is_retried_without_duplicates(spark: Any, tmp_path: Path) -> None:
    """The Python code that produces the partition (in the writing task, in front of the
    write) fails the task's first attempt once some of its rows were appended; Spark
    retries the task, which appends the same keys again: dedup answers those already in
    the log, and every row is there once."""
    url = f"file://{tmp_path / 'wal'}"
    marker = tmp_path / "failed-after"
    # 1 KiB payloads: the worker's 64 KiB output buffer flushes rows on to the write long
    # before the generator stops to wait.
    part = [(row[0], row[1] + bytes(1024), *row[2:]) for row in rows(0, 300)]

    def produce(partition: int) -> Any:
        # Runs in a Python worker: imports, closure cells and constants only.
        import time

        from pyspark import TaskContext

        import walsvc as w

        context = TaskContext.get()
        assert context is not None
        failing = context.attemptNumber() == 0

        async def appended() -> int:
            seen: list[Any] = []
            try:
                reader = await w.open_wal(url, "p0", read_only=True)
            except w.InvalidArgument:  # the writer did not create the pchannel yet
                return 0
            async with reader as wal:
                async with wal.read() as scanner:
                    batches = scanner.batches()
                    try:
                        while True:
                            async with asyncio.timeout(0.2):
                                seen += await anext(batches)
                    except TimeoutError:
                        await batches.aclose()
            return sum(m.payload.startswith(b"0-") for m in seen)

        for i, row in enumerate(part):
            yield row
            if failing and i == 200:
                deadline = time.monotonic() + HANG
                count = 0
                while count == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                    count = asyncio.run(appended())
                marker.write_text(str(count))
                raise RuntimeError("injected failure after rows were appended")

    rdd = spark.sparkContext.parallelize([0], 1).flatMap(produce)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        write(spark.createDataFrame(rdd, SCHEMA), url, "p0", appendBatch=10)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert 0 < int(marker.read_text()) <= 200, "the first attempt appended nothing"
    delivered = read_all(url, "p0")
    check_exactly_once(delivered, part)
    # The first attempt's rows stayed; the retry (a later writer) appended the rest, in
    # partition order.
    terms = [m.term for m in data_of(delivered)]
    assert terms.count(terms[0]) >= int(marker.read_text())
    assert terms == sorted(terms)
    assert terms[-1] > terms[0]
    assert [m.payload for m in data_of(delivered)] == [row[1] for row in part]


def test_concurrent_tasks_on_one_pchannel(spark: Any, tmp_path: Path) -> None:
    """Two tasks start appending to the same pchannel at the same moment (a barrier in
    front of the write), fencing each other; each re-appends after a takeover and the
    log still holds every row once."""
    url = f"file://{tmp_path / 'wal'}"
    gate = tmp_path / "gate"
    gate.mkdir()
    parts = [rows(p, 1500) for p in range(2)]

    def produce(partition: int) -> Any:
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        (gate / f"{partition}-{context.attemptNumber()}").touch()
        deadline = time.monotonic() + HANG
        while len(list(gate.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        yield from parts[partition]

    rdd = spark.sparkContext.parallelize(range(2), 2).flatMap(produce)
    write(spark.createDataFrame(rdd, SCHEMA), url, "p0", appendBatch=25)
    delivered = read_all(url, "p0")
    check_exactly_once(delivered, parts[0] + parts[1])
    assert len({m.term for m in data_of(delivered)}) >= 2


@pytest.mark.parametrize(
    ("case", "error", "text"),
    [
        ("unknown column", "InvalidArgument", "unknown column 'extra'"),
        ("missing payload", "InvalidArgument", "required column 'payload' is missing"),
        ("string payload", "InvalidArgument", "column 'payload' is string, expected binary"),
        ("overwrite", "InvalidArgument", "a WAL is append-only"),
        ("memory url", "InvalidArgument", "a memory:// WAL lives in one process"),
        ("unknown scheme", "UnknownBackend", "nosuch"),
        ("unknown option", "InvalidArgument", "unknown walsvc data source option 'batch"),
    ],
)
def test_bad_writes_are_refused_on_the_driver(
    spark: Any, tmp_path: Path, case: str, error: str, text: str
) -> None:
    df = spark.createDataFrame([("v1", b"x", 2, {})], SCHEMA)
    url, mode, options = f"file://{tmp_path}", "append", {}
    if case == "unknown column":
        df = df.selectExpr("*", "1 AS extra")
    elif case == "missing payload":
        df = df.drop("payload")
    elif case == "string payload":
        df = df.selectExpr("vchannel", "CAST(payload AS STRING) AS payload")
    elif case == "overwrite":
        mode = "overwrite"
    elif case == "memory url":
        url = "memory://shared"
    elif case == "unknown scheme":
        url = "nosuch://x"
    else:
        options = {"batchSize": "10"}
    writer = df.write.format("walsvc").mode(mode).option("url", url).option("pchannel", "p0")
    with pytest.raises(Exception, match=rf"walsvc\.{error}: .*") as caught:
        writer.options(**options).save()
    assert text in str(caught.value)
    assert not (tmp_path / "p0").exists(), "a refused write touched the log"


def test_null_payload_fails_the_task(spark: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    df = spark.createDataFrame([("v1", b"a", None, None), ("v1", None, None, None)], SCHEMA)
    with pytest.raises(Exception, match=r"InvalidMessage: row 1 of the partition has a null"):
        write(df.coalesce(1), url, "p0", appendBatch=1)
    # The row before it stays (a WAL cannot take it back); each retry of the task appended
    # it again with the same key, and dedup answered.
    assert [m.payload for m in data_of(read_all(url, "p0"))] == [b"a"]


def test_stream_round_trip_and_rerun_after_restart(spark: Any, tmp_path: Path) -> None:
    """Three Parquet files, one micro-batch each (Trigger.AvailableNow). Then the last
    batch's commit record is removed from the checkpoint, as if the query died after
    the write and before the commit: the restarted query runs that micro-batch again
    (same query id, same batch id, same keys) and dedup answers every row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = f"file://{tmp_path / 'wal'}"
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    parts = [rows(p, 20) for p in range(3)]
    for p, part in enumerate(parts):
        table = pa.table(
            {
                "vchannel": [r[0] for r in part],
                "payload": [r[1] for r in part],
                "type": pa.array([r[2] for r in part], pa.int32()),
                "properties": pa.array(
                    [None if r[3] is None else list(r[3].items()) for r in part],
                    pa.map_(pa.string(), pa.string()),
                ),
            }
        )
        pq.write_table(table, source / f"{p}.parquet")

    def run_query() -> Any:
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
        query = (
            stream.parquet(str(source))
            .writeStream.format("walsvc")
            .option("url", url)
            .option("pchannel", "p0")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(HANG * 2), "the streaming query did not finish"
        return query

    first = run_query()
    before = read_all(url, "p0")
    check_exactly_once(before, [row for part in parts for row in part])
    keys = [str(m.idempotency_key) for m in data_of(before)]
    assert all(key.startswith(f"{first.id}/") for key in keys)
    assert {key.split("/")[1] for key in keys} == {"0", "1", "2"}  # the micro-batch ids

    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    second = run_query()
    assert second.id == first.id
    rerun = [p for p in second.recentProgress if p["batchId"] == 2]
    assert rerun, "batch 2 did not run again"
    assert rerun[0]["numInputRows"] == len(parts[2])
    after = read_all(url, "p0")
    check_exactly_once(after, [row for part in parts for row in part])
    assert data_of(after) == data_of(before)
    # The re-run really opened the WAL: a newer writer's TimeTick follows the rows.
    assert max(m.term for m in after) > max(m.term for m in data_of(before))


def test_stream_keys_name_query_batch_and_partition() -> None:
    """A re-run micro-batch derives the keys of its first run: they depend only on the
    query id (kept in the checkpoint), the batch id and the partition, never on the
    writer object Spark builds anew for every micro-batch."""
    from pyspark.sql.types import StructType

    options = _options.parse_write_options({"url": "file:///tmp/x", "pchannel": "p0"})
    plan = plan_write(options, StructType.fromDDL(SCHEMA), overwrite=False, streaming=True)
    assert plan.write_id is None  # the task takes the query id
    assert stream_producer("q", "7", 1) == stream_producer("q", "7", 1) == "q/7/1"
    batch = plan_write(options, StructType.fromDDL(SCHEMA), overwrite=False, streaming=False)
    other = plan_write(options, StructType.fromDDL(SCHEMA), overwrite=False, streaming=False)
    assert batch.write_id != other.write_id  # a batch write without writeId: a fresh uuid4


def test_kafka_round_trip(spark: Any, tansu_url: str) -> None:
    pchannel = fresh()
    parts = [rows(p, 40) for p in range(2)]
    write(frame(spark, parts), tansu_url, pchannel, appendBatch=16)
    check_exactly_once(read_all(tansu_url, pchannel), parts[0] + parts[1])


def test_write_options() -> None:
    parsed = _options.parse_write_options(
        {
            "url": "file:///tmp/x",
            "pchannel": "p0",
            "dedupMaxKeys": "500",
            "dedupMaxAge": "30",
            "checkpointLocation": "/tmp/checkpoint",
        }
    )
    assert (parsed.dedup_max_keys, parsed.dedup_max_age) == (500, 30.0)
    with pytest.raises(walsvc.InvalidArgument, match="'dedupMaxKeys' must be at least 1"):
        _options.parse_write_options({"url": "file:///x", "pchannel": "p", "dedupMaxKeys": "0"})


def keyed(producer: str, count: int) -> list[walsvc.Message]:
    return [
        walsvc.Message(
            payload=b"%d" % i, vchannel="v", idempotency_key=walsvc.producer_key(producer, i)
        )
        for i in range(count)
    ]


def test_appender_counts_rows_already_in_the_log(tmp_path: Path) -> None:
    """A second attempt re-appending the first one's keys (and more) appends only the
    new ones, and says how many were answered by dedup."""
    options = _options.WriteOptions(url=f"file://{tmp_path}", pchannel="p0")

    async def main() -> None:
        first = _Appender(options)
        _, answered = await first.append(keyed("w/0", 10))
        await first.aclose()
        assert answered == 0
        retry = _Appender(options)
        results, answered = await retry.append(keyed("w/0", 15))
        await retry.aclose()
        assert answered == 10
        assert len({r.message_id for r in results}) == 15

    asyncio.run(main())
    assert len(data_of(read_all(f"file://{tmp_path}", "p0"))) == 15


def test_appender_takes_the_pchannel_back_after_being_fenced(tmp_path: Path) -> None:
    """Another writer fences the appender between two appends: the appender waits for
    the pchannel to go quiet, reopens it and appends; nothing is lost or doubled."""
    url = f"file://{tmp_path}"
    options = _options.WriteOptions(url=url, pchannel="p0")

    async def main() -> int:
        appender = _Appender(options, rng=random.Random(1))
        messages = keyed("a/0", 20)
        await appender.append(messages[:10])
        async with await walsvc.open_wal(url, "p0") as other:  # fences the appender
            await other.append(walsvc.Message(payload=b"other", vchannel="v"))
        _, answered = await appender.append(messages[10:])
        await appender.aclose()
        assert answered == 0
        return appender.reopens

    assert asyncio.run(main()) == 1
    payloads = [m.payload for m in data_of(read_all(url, "p0"))]
    assert payloads == [b"%d" % i for i in range(10)] + [b"other"] + [
        b"%d" % i for i in range(10, 20)
    ]


def test_dedup_window_limit_is_real(tmp_path: Path) -> None:
    """The documented limit: a retry whose rows fell out of the dedup window
    (``dedupMaxKeys``) appends them again."""
    options = _options.WriteOptions(url=f"file://{tmp_path}", pchannel="p0", dedup_max_keys=5)

    async def main() -> int:
        first = _Appender(options)
        await first.append(keyed("w/0", 20))
        await first.aclose()
        retry = _Appender(options)
        _, answered = await retry.append(keyed("w/0", 20))
        await retry.aclose()
        return answered

    assert asyncio.run(main()) == 5  # the newest 5 keys; the other 15 went in again
    assert len(data_of(read_all(f"file://{tmp_path}", "p0"))) == 35
