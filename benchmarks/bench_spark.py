"""WAL -> Parquet through Spark on ``local[2]``: the ``walsvc`` data source (Arrow batches
built column-wise) against a row-tuple reader of the same log, side by side.

The log (built once per asv run by ``setup_cache``): ROWS messages of 100 bytes over 16
vchannels in one file pchannel, read as two id-range partitions (one per core). Each
measure is one ``spark.read.format(...).load().write.parquet(...)`` of every row; the
rate is rows written per second of that job.

The baseline (``TupleSource``) is the straightforward reader: a raw ``WAL.read`` of each
range, one Python tuple per row. Spark and the JVM's Parquet writer are the same on both
sides.

Target (issue 6): >= 500k rows/s for the walsvc source.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import timeit
from collections.abc import Iterator
from typing import Any

import walsvc
from walsvc import Message

from ._common import PAYLOAD, VCHANNELS, note, side_by_side

ROWS = 1_000_000
BUILD_BATCH = 8_000
REPEATS = 3
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def build_log(directory: str) -> None:
    """ROWS messages, vchannel ``v{i % 16}`` for the i-th, no interceptors (no TimeTicks)."""
    batch = [Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(BUILD_BATCH)]
    url = f"file://{directory}"
    async with await walsvc.open_wal(url, "p0", sync="none", interceptors=[]) as wal:
        for _ in range(ROWS // BUILD_BATCH):
            await wal.append_many(batch)


def tuple_source() -> Any:
    """The baseline data source class (defined lazily: pyspark is an extra)."""
    from pyspark.sql.datasource import DataSourceReader, InputPartition

    from walsvc.spark import WalDataSource
    from walsvc.spark._options import parse_source_options
    from walsvc.spark._ranges import IdRange, plan_ranges
    from walsvc.spark._sync import iterate, run

    class TupleReader(DataSourceReader):
        def __init__(self, options: Any) -> None:
            self.options = options

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(r) for r in run(plan_ranges(self.options))]

        def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
            owned: IdRange = partition.value
            for batch in iterate(lambda: _raw_range(self.options.url, owned)):
                for m in batch:
                    yield (
                        owned.pchannel,
                        m.message_id.marshal(),
                        m.timetick,
                        m.vchannel,
                        int(m.type),
                        dict(m.properties),
                        m.payload,
                        None if m.txn is None else m.txn.txn_id,
                    )

    class TupleSource(WalDataSource):
        @classmethod
        def name(cls) -> str:
            return "walsvc_tuples"

        def reader(self, schema: Any) -> DataSourceReader:
            return TupleReader(parse_source_options(self.options))

    return TupleSource


async def _raw_range(url: str, owned: Any) -> Any:
    """Every message of ``owned`` as ``WAL.read`` decodes it (raw: this log has no
    transactions), in batches."""
    after, end = owned.bounds()
    deliver = (
        walsvc.DeliverPolicy.all() if after is None else walsvc.DeliverPolicy.start_after(after)
    )
    async with await walsvc.open_wal(url, owned.pchannel, read_only=True) as wal:
        async with wal.read(deliver, raw=True) as scanner:
            async for batch in scanner.batches():
                if batch[-1].message_id >= end:
                    yield [m for m in batch if m.message_id <= end]
                    return
                yield batch


class SparkToParquet:
    """WAL -> Parquet rows/s on local[2]: walsvc's Arrow source and the tuple baseline."""

    unit = "rows/s"
    timer = timeit.default_timer
    timeout = 900
    number = 1
    repeat = 1

    def setup_cache(self) -> str:
        directory = os.path.abspath("spark-wal")
        asyncio.run(build_log(directory))
        return directory

    def setup(self, directory: str) -> None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        # Spark's Python workers import the baseline source from this package.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p
        )
        from pyspark.sql import SparkSession

        import walsvc.spark

        self.spark = (
            SparkSession.builder.master("local[2]")
            .appName("walsvc-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        walsvc.spark.register(self.spark)
        self.spark.dataSource.register(tuple_source())
        self.url = f"file://{directory}"
        self.out = tempfile.mkdtemp(prefix="walsvc-bench-parquet-")

    def teardown(self, directory: str) -> None:
        self.spark.stop()
        shutil.rmtree(self.out, ignore_errors=True)

    def _rate(self, source: str) -> float:
        df = (
            self.spark.read.format(source)
            .option("url", self.url)
            .option("pchannels", "p0")
            .option("maxRecordsPerPartition", str(ROWS // 2))
            .load()
        )
        target = os.path.join(self.out, source)
        start = time.perf_counter()
        df.write.mode("overwrite").parquet(target)
        elapsed = time.perf_counter() - start
        written = self.spark.read.parquet(target).count()
        if written != ROWS:
            raise AssertionError(f"{source} wrote {written} rows, expected {ROWS}")
        return ROWS / elapsed

    def _side_by_side(self) -> tuple[list[float], list[float]]:
        """(tuple baseline, walsvc) rows/s, REPEATS runs each, alternately, after one
        warm-up run of each (the JVM's JIT needs a few million rows to settle)."""
        self._rate("walsvc")
        self._rate("walsvc_tuples")
        loop = asyncio.new_event_loop()
        try:

            async def arrow() -> float:
                return self._rate("walsvc")

            async def tuples() -> float:
                return self._rate("walsvc_tuples")

            baseline, ours = side_by_side(loop, REPEATS, tuples, arrow)
        finally:
            loop.close()
        note(f"spark->parquet: tuples {[round(r) for r in baseline]} rows/s")
        note(f"spark->parquet: walsvc {[round(r) for r in ours]} rows/s")
        return baseline, ours

    def track_walsvc_arrow(self, directory: str) -> float:
        """walsvc source, Arrow batches built column-wise, rows/s, best of three measured
        alternately with the baseline (target >= 500k rows/s)."""
        _, ours = self._side_by_side()
        return max(ours)

    def track_ratio_to_row_tuples(self, directory: str) -> float:
        """Best walsvc rate over the best row-tuple rate, measured side by side."""
        baseline, ours = self._side_by_side()
        return max(ours) / max(baseline)

    track_ratio_to_row_tuples.unit = "ratio"  # type: ignore[attr-defined]
