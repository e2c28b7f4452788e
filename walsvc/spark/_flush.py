"""The flush job: a Structured Streaming query that copies WAL pchannels into Parquet files
partitioned by vchannel, exactly once across restarts.

The query reads ``format("walsvc")`` (micro-batches of id ranges, see ``_stream``) and
writes with Spark's file sink. Exactly once rests on two logs Spark keeps: the
checkpoint's offset and commit logs (which id range each micro-batch covers; a batch
planned but not committed is re-run with the same range after a restart) and the sink's
``_spark_metadata`` log in the output directory (which files each committed batch
wrote; a batch already in it is not written again). Files of a batch that died before
its commit stay on disk but are in no log: readers that honour ``_spark_metadata``
(``spark.read.parquet``, ``read_flushed``) never see them; readers that list the
directory (pyarrow, DuckDB) do, unless given ``flushed_files`` (``_sink_log``).

The checkpoint defaults to ``<to>/_walsvc_checkpoint``, so an output directory and its
checkpoint are kept, moved and deleted together (Spark and pyarrow skip ``_`` names when
they list data files). The flush refuses to start when the output holds a flush log but
the checkpoint is empty: the file sink skips batch numbers it has logged, so a fresh
checkpoint would silently drop data.

Layout: ``<to>/vchannel=<name>/part-*.parquet`` with every column of
``walsvc.spark.SCHEMA`` but ``vchannel`` (it is the directory). The broadcast vchannel
``""`` is stored as Spark's null partition (``vchannel=__HIVE_DEFAULT_PARTITION__``);
``read_flushed`` gives it back as ``""``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast, final
from urllib.parse import urlsplit

from walsvc.core._errors import InvalidArgument

from ._options import SourceOptions, parse_source_options
from ._ranges import latest_ids
from ._rows import COLUMNS, SCHEMA
from ._sink_log import SINK_LOG
from ._source import WalDataSource
from ._sync import run
from ._workers import check_workers

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = (
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
)

#: Name of the default checkpoint directory, inside the output directory.
CHECKPOINT_NAME: Final = "_walsvc_checkpoint"
#: How often a following (not ``available_now``) flush plans a micro-batch.
DEFAULT_TRIGGER_INTERVAL: Final = "5 seconds"
#: The application file to give ``spark-submit``: it runs ``walsvc flush`` with the
#: arguments that follow it, on the master spark-submit was given. It lives with the
#: command line (``walsvc/apps``), which sits above this package: a path, not an import.
FLUSH_APP: Final = str(Path(__file__).parent.parent / "apps" / "_flush_app.py")

#: Options the flush sets itself (by their parameters), in Spark's case-folded form.
_OWN_OPTIONS: Final = frozenset({"url", "pchannels", "maxrecordspertrigger", "path"})


@final
@dataclass(frozen=True, slots=True)
class BatchProgress:
    """One micro-batch the flush query ran: its number, the rows it wrote, how long it
    took, and the offsets it read between (pchannel -> marshalled id, None: the start of
    the log)."""

    #: Spark's micro-batch number (counts on across restarts).
    batch_id: int
    #: Rows written (data messages; a committed transaction counts its bodies).
    rows: int
    #: Wall time of the micro-batch, planning and commit included.
    seconds: float
    #: ``rows`` over the time Spark spent processing them.
    rows_per_second: float
    #: Offsets the micro-batch started after.
    start: dict[str, str | None]
    #: Offsets the micro-batch read up to, inclusive.
    end: dict[str, str | None]

    @classmethod
    def from_progress(cls, progress: Mapping[str, Any]) -> BatchProgress | None:
        """The micro-batch a Spark progress report (``StreamingQueryProgress`` as JSON)
        describes, or None if the report is an idle one (no micro-batch ran)."""
        start: dict[str, str | None] = {}
        end: dict[str, str | None] = {}
        for source in progress.get("sources") or ():
            start.update(_offsets(source.get("startOffset")))
            end.update(_offsets(source.get("endOffset")))
        if not end or end == start:
            return None
        return cls(
            batch_id=int(progress["batchId"]),
            rows=int(progress.get("numInputRows") or 0),
            seconds=float(progress.get("batchDuration") or 0) / 1000,
            rows_per_second=float(progress.get("processedRowsPerSecond") or 0.0),
            start=start,
            end=end,
        )

    def describe(self) -> str:
        """One line for a person: ``batch 7: 1,000 rows in 0.52 s (1,923 rows/s);
        p0 file:99 -> file:1099`` (only the pchannels the batch moved)."""
        moved = ", ".join(
            f"{p} {self.start.get(p) or 'start'} -> {e}"
            for p, e in self.end.items()
            if e != self.start.get(p)
        )
        return (
            f"batch {self.batch_id}: {self.rows:,} rows in {self.seconds:.2f} s"
            f" ({self.rows_per_second:,.0f} rows/s); {moved}"
        )


def default_checkpoint(to: str) -> str:
    """The checkpoint directory a flush into ``to`` uses unless given one:
    ``<to>/_walsvc_checkpoint``."""
    return f"{to.rstrip('/')}/{CHECKPOINT_NAME}"


def check_source(
    url: str,
    pchannels: str | Sequence[str],
    /,
    *,
    max_records_per_trigger: int | None = None,
    **source_options: object,
) -> SourceOptions:
    """Validate the source options a flush would use and open every pchannel read-only
    once (so an unknown scheme, a missing pchannel or an unreachable broker fails here,
    on the caller's thread, before any Spark query starts). Returns the parsed options;
    raises ``walsvc.WALError`` (``InvalidArgument``, ``UnknownBackend``,
    ``BackendUnavailable``, ...) otherwise. Must not be called from a running event loop."""
    return _check(_reader_options(url, pchannels, max_records_per_trigger, source_options))


def start_flush(
    spark: SparkSession,
    *,
    url: str,
    pchannels: str | Sequence[str],
    to: str,
    checkpoint: str | None = None,
    available_now: bool = False,
    trigger_interval: str = DEFAULT_TRIGGER_INTERVAL,
    max_records_per_trigger: int | None = None,
    query_name: str | None = None,
    **source_options: object,
) -> StreamingQuery:
    """Start the flush of ``pchannels`` (a list, or names separated by commas) of the WAL
    at ``url`` into Parquet under ``to``, partitioned by vchannel, and return the running
    query.

    Every data message (a committed transaction: each of its bodies) is written exactly
    once over any number of runs that share ``checkpoint`` (default
    ``default_checkpoint(to)``), however they end; a rolled-back or still open
    transaction is not written. ``available_now``: flush what the log holds when the
    query starts, then stop; otherwise plan a micro-batch every ``trigger_interval``
    until stopped. ``max_records_per_trigger`` bounds the log records one micro-batch
    covers; ``source_options`` are further ``walsvc`` data source options
    (``vchannels``, ``types``, ``timetickFrom``, ``backend.<name>``, ...). A relative
    ``file://`` URL is made absolute here, since executors run elsewhere.

    Registers the ``walsvc`` data source in ``spark`` (with ``register``'s check of the
    workers' Python). Raises ``walsvc.WALError`` before starting anything if that check
    or ``check_source`` fails, or the output already holds a flush log that the
    checkpoint does not know. Must not be called from a running event loop.
    """
    options = _reader_options(url, pchannels, max_records_per_trigger, source_options)
    _check(options)
    checkpoint = checkpoint or default_checkpoint(to)
    _check_checkpoint(to, checkpoint)
    check_workers(spark)  # the workers plan and read: they must import walsvc
    spark.dataSource.register(WalDataSource)  # idempotent: the caller need not have
    if not any(key.lower() == "minpartitions" for key in options):
        # Every core reads: a micro-batch's ranges are cut at least this fine.
        options["minPartitions"] = str(spark.sparkContext.defaultParallelism)
    reader = spark.readStream.format(WalDataSource.name())
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .writeStream.format("parquet")
        .partitionBy("vchannel")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
    )
    if query_name is not None:
        writer = writer.queryName(query_name)
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=trigger_interval)
    )
    return writer.start(to)


def watch_progress(
    query: StreamingQuery,
    on_batch: Callable[[BatchProgress], object],
    *,
    poll_interval: float = 0.5,
    timeout: float | None = None,
    stop: threading.Event | None = None,
) -> bool:
    """Call ``on_batch`` once for each micro-batch ``query`` completes (in order, as they
    complete, at most ``poll_interval`` seconds late) until the query terminates (returns
    True), or ``timeout`` seconds pass or ``stop`` is set (returns False; the query keeps
    running). Raises the query's ``StreamingQueryException`` if it failed. ``stop`` is
    how a signal handler ends the wait: it needs no call into Spark."""
    deadline = None if timeout is None else time.monotonic() + timeout
    reported = -1
    spark_query = cast(Any, query)  # awaitTermination's hint says int; it takes seconds

    def report() -> None:
        nonlocal reported
        for item in query.recentProgress:
            progress = item if isinstance(item, Mapping) else json.loads(item.json)
            batch = BatchProgress.from_progress(progress)
            if batch is not None and batch.batch_id > reported:
                reported = batch.batch_id
                on_batch(batch)

    while True:
        wait = poll_interval
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
        done = bool(spark_query.awaitTermination(max(wait, 0.001)))
        report()
        if done:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if stop is not None and stop.is_set():
            return False


def flush(
    spark: SparkSession,
    *,
    url: str,
    pchannels: str | Sequence[str],
    to: str,
    checkpoint: str | None = None,
    max_records_per_trigger: int | None = None,
    on_batch: Callable[[BatchProgress], object] | None = None,
    timeout: float | None = None,
    **source_options: object,
) -> list[BatchProgress]:
    """Flush what the log holds now (``start_flush`` with ``available_now``) and return
    the micro-batches it ran, after calling ``on_batch`` for each as it completed. If
    ``timeout`` seconds pass first, the query is stopped and ``TimeoutError`` raised;
    the batches committed so far stay, and the next flush goes on from them."""
    query = start_flush(
        spark,
        url=url,
        pchannels=pchannels,
        to=to,
        checkpoint=checkpoint,
        available_now=True,
        max_records_per_trigger=max_records_per_trigger,
        **cast(dict[str, Any], source_options),
    )
    batches: list[BatchProgress] = []

    def note(batch: BatchProgress) -> None:
        batches.append(batch)
        if on_batch is not None:
            on_batch(batch)

    try:
        finished = watch_progress(query, note, timeout=timeout)
    finally:
        if query.isActive:
            query.stop()
    if not finished:
        raise TimeoutError(f"the flush into {to} did not finish within {timeout:g} s")
    return batches


def read_flushed(spark: SparkSession, to: str) -> DataFrame:
    """What flushes wrote into ``to``, committed files only (the sink's
    ``_spark_metadata`` log), as a DataFrame with the columns and types of
    ``walsvc.spark.SCHEMA``: ``vchannel`` stays a string (names that look like numbers
    too) and the broadcast vchannel reads as ``""``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    stored = StructType(
        [f for f in SCHEMA.fields if f.name != "vchannel"]
        + [f for f in SCHEMA.fields if f.name == "vchannel"]
    )
    frame = spark.read.schema(stored).parquet(to)
    columns = [
        F.coalesce(F.col(c), F.lit("")).alias(c) if c == "vchannel" else F.col(c) for c in COLUMNS
    ]
    return frame.select(*columns)


def _reader_options(
    url: str,
    pchannels: str | Sequence[str],
    max_records_per_trigger: int | None,
    extra: Mapping[str, object],
) -> dict[str, str]:
    """The ``walsvc`` source options of a flush, as the strings Spark passes on."""
    if not isinstance(url, str) or not url:
        raise InvalidArgument("url is required: the WAL to flush (file:///path, kafka://...)")
    names = pchannels.split(",") if isinstance(pchannels, str) else list(pchannels)
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise InvalidArgument("pchannels is required: the pchannels to flush, comma-separated")
    owned = sorted(k for k in extra if k.lower() in _OWN_OPTIONS)
    if owned:
        raise InvalidArgument(
            f"source option {owned[0]!r} is set by the flush itself; use its parameter"
        )
    options = {"url": _absolute_file_url(url), "pchannels": ",".join(names)}
    if max_records_per_trigger is not None:
        options["maxRecordsPerTrigger"] = str(max_records_per_trigger)
    options.update((key, _option_text(value)) for key, value in extra.items())
    return options


def _check(options: Mapping[str, str]) -> SourceOptions:
    parsed = parse_source_options(_case_insensitive(options))
    try:
        run(latest_ids(parsed))
    except TypeError as exc:  # open_wal's answer to an unknown backend option
        raise InvalidArgument(f"{exc} (given as backend.<name> source options)") from None
    return parsed


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _absolute_file_url(url: str) -> str:
    """``file://rel/dir`` as ``file:///abs/rel/dir`` (the file backend reads a relative
    location from the current directory, which an executor does not share)."""
    scheme, _, location = url.partition("://")
    if scheme != "file" or not location:
        return url
    return f"file://{os.path.abspath(os.path.expanduser(location))}"


def _case_insensitive(options: Mapping[str, str]) -> Mapping[str, str]:
    """``options`` looked up as Spark looks them up (case-insensitively)."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    return cast(Mapping[str, str], CaseInsensitiveDict(options))


def _local_dir(path: str) -> Path | None:
    """``path`` as a local directory, or None if it names another filesystem."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return Path(parts.path)
    if parts.scheme and len(parts.scheme) > 1:  # hdfs://, s3a://, ... (not C:\ paths)
        return None
    return Path(path)


def _batch_files(directory: Path) -> Iterable[Path]:
    """The numbered batch entries of a Spark log directory (offsets, commits, sink)."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return ()
    return [e for e in entries if e.name.split(".", 1)[0].isdigit()]


def _check_checkpoint(to: str, checkpoint: str) -> None:
    """Refuse a checkpoint that knows nothing of a flush log already in ``to`` (local
    paths only: other filesystems are not checked)."""
    output, state = _local_dir(to), _local_dir(checkpoint)
    if output is None or state is None:
        return
    if any(_batch_files(output / SINK_LOG)) and not any(_batch_files(state / "offsets")):
        raise InvalidArgument(
            f"{to} already holds flushed batches (its {SINK_LOG} log) but the checkpoint"
            f" {checkpoint} has none; the file sink would skip the batch numbers it logged"
            " and lose data. Use the checkpoint that wrote it, or a new output directory."
        )


def _offsets(value: object) -> dict[str, str | None]:
    """A source offset from a progress report (a JSON object, or its text)."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        return {}
    return {str(k): None if v is None else str(v) for k, v in value.items()}
