"""walsvc on Spark (extra ``walsvc[spark]``): the ``walsvc`` PySpark data source and the
WAL -> Parquet flush job.

Register the data source once per SparkSession::

    walsvc.spark.register(spark)
    df = spark.read.format("walsvc").option("url", "file:///data/wal") \\
        .option("pchannels", "p0,p1").load()

Every Spark executor needs walsvc (with the backend's extra) installed. The names that
need pyspark are imported on first use: ``flushed_files`` (the Parquet files a flush
committed, for pyarrow or DuckDB) works without pyspark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from ._options import SourceOptions, WriteOptions
from ._ranges import IdRange, RangeStalled
from ._sink_log import flushed_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    from ._rows import COLUMNS, SCHEMA
    from ._source import WalDataSource

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
    "flushed_files",
    "read_flushed",
    "register",
    "start_flush",
    "watch_progress",
)


#: The names that need pyspark, by the module that defines them: imported on first use,
#: so ``flushed_files`` (and ``import walsvc.spark``) works where pyspark is not installed.
_NEEDS_PYSPARK: Final = {
    **dict.fromkeys(
        (
            "CHECKPOINT_NAME",
            "DEFAULT_TRIGGER_INTERVAL",
            "FLUSH_APP",
            "BatchProgress",
            "check_source",
            "default_checkpoint",
            "flush",
            "read_flushed",
            "start_flush",
            "watch_progress",
        ),
        "._flush",
    ),
    "COLUMNS": "._rows",
    "SCHEMA": "._rows",
    "WalDataSource": "._source",
}


def __getattr__(name: str) -> Any:
    """The names of ``_NEEDS_PYSPARK``, imported when first asked for."""
    module = _NEEDS_PYSPARK.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def register(spark: SparkSession) -> None:
    """Make ``format("walsvc")`` available in ``spark`` (idempotent).

    Also turns on ``spark.sql.python.filterPushdown.enabled`` for the session: the batch
    reader takes pushed-down filters, and Spark refuses to plan a reader that does while
    the setting is off (it only concerns Python data sources).

    Spark's Python workers must import walsvc. With a local master and
    ``PYSPARK_PYTHON`` unset they are pointed at this interpreter (Spark's default,
    ``python3`` from ``PATH``, often lacks walsvc); otherwise an interpreter this machine
    has is checked, and one that cannot import walsvc raises ``walsvc.InvalidArgument``
    naming ``PYSPARK_PYTHON`` (``walsvc.spark._workers`` has the details).
    """
    from ._source import WalDataSource
    from ._workers import check_workers

    check_workers(spark)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(WalDataSource)
