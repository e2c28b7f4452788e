"""The Spark side of the pipeline tests: one real local SparkSession for the whole run,
and helpers to fill a WAL from synchronous tests.

``spark`` (session): ``local[2, 3]`` (two cores; a failed task is retried up to 3 times,
as on a cluster), UI off, two shuffle partitions, filter pushdown for Python data sources
on, the ``walsvc`` data source registered, its JVM started with ``QUICK_JVM``. Python
workers run this interpreter, which has walsvc installed. Without Java or pyspark the
fixture FAILS; it never skips.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from _spark_cluster import QUICK_JVM

import walsvc
from walsvc import AppendResult, Message

__all__ = ("QUIET", "append_messages", "read_all", "spark")

#: Seconds without a new message after which a reference scan of a quiet log ends.
QUIET = 1.5


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession shared by every Spark test of the run."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark tests need Java 17+ on PATH (or JAVA_HOME); none found")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import walsvc.spark

    session = (
        SparkSession.builder.master("local[2, 3]")
        .appName("walsvc-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", QUICK_JVM)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    walsvc.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


def append_messages(
    url: str, pchannel: str, messages: Sequence[Message], **options: Any
) -> list[AppendResult]:
    """Append ``messages`` to ``pchannel`` (read-write open, default chain) and close."""

    async def main() -> list[AppendResult]:
        async with await walsvc.open_wal(url, pchannel, **options) as wal:
            return await wal.append_many(messages)

    return asyncio.run(main())


def read_all(
    url: str, pchannel: str, filters: Sequence[walsvc.Filter] = (), **options: Any
) -> list[walsvc.ImmutableMessage]:
    """What ``WAL.read`` (read-only, from the start, TimeTicks included) delivers of a log
    nobody appends to: the reference the data source is checked against. The scan ends
    once nothing new arrives for ``QUIET`` seconds."""

    async def main() -> list[walsvc.ImmutableMessage]:
        out: list[walsvc.ImmutableMessage] = []
        async with await walsvc.open_wal(url, pchannel, read_only=True, **options) as wal:
            async with wal.read(filters=filters, timeticks=True) as scanner:
                batches = scanner.batches()
                while True:
                    try:
                        async with asyncio.timeout(QUIET):
                            out += await anext(batches)
                    except TimeoutError:
                        await batches.aclose()
                        return out

    return asyncio.run(main())
