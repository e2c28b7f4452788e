"""walsvc on Spark (extra ``walsvc[spark]``): the ``walsvc`` PySpark data source and the
WAL -> Parquet flush job.

Register the data source once per SparkSession::

    walsvc.spark.register(spark)
    df = spark.read.format("walsvc").option("url", "file:///data/wal") \\
        .option("pchannels", "p0,p1").load()

Every Spark executor needs walsvc (with the backend's extra) installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._flush import (
    CHECKPOINT_NAME,
    DEFAULT_TRIGGER_INTERVAL,
    FLUSH_APP,
    BatchProgress,
    check_source,
    default_checkpoint,
    flush,
    read_flushed,
    start_flush,
    watch_progress,
)
from ._options import SourceOptions, WriteOptions
from ._ranges import IdRange, RangeStalled
from ._rows import COLUMNS, SCHEMA
from ._source import WalDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = (
    "CHECKPOINT_NAME",
    "COLUMNS",
    "DEFAULT_TRIGGER_INTERVAL",
    "FLUSH_APP",
    "SCHEMA",
    "BatchProgress",
    "IdRange",
    "RangeStalled",
    "SourceOptions",
    "WalDataSource",
    "WriteOptions",
    "check_source",
    "default_checkpoint",
    "flush",
    "read_flushed",
    "register",
    "start_flush",
    "watch_progress",
)


def register(spark: SparkSession) -> None:
    """Make ``format("walsvc")`` available in ``spark`` (idempotent).

    Also turns on ``spark.sql.python.filterPushdown.enabled`` for the session: the batch
    reader takes pushed-down filters, and Spark refuses to plan a reader that does while
    the setting is off (it only concerns Python data sources).
    """
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(WalDataSource)
