"""``walsvc flush``: the flush job (``walsvc.spark.start_flush``, extra
``walsvc[spark]``) on the command line. A Structured Streaming query copies pchannels into
Parquet partitioned by vchannel, exactly once across restarts, printing one line per
micro-batch. Exit status: 0 when ``--once`` finished, 1 when the query failed, 2 for bad
usage or a source it cannot open (checked before Spark starts), 130 when stopped with
Ctrl-C (143: SIGTERM); a stop lets the running micro-batch go (the next run redoes it)
and exits once Spark stopped. ``walsvc.spark`` (and pyspark) is imported only when the
command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from walsvc.core._errors import WALError

from ._cli_args import UsageError, int_at_least

__all__ = ("add_flush_parser", "run_flush_command")


def add_flush_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``flush`` subcommand and its arguments to ``commands``."""
    flush = commands.add_parser(
        "flush",
        help="stream pchannels into Parquet partitioned by vchannel, exactly once",
        description=(
            "Run a Spark Structured Streaming query that copies the pchannels of a WAL into"
            " Parquet files under PATH, partitioned by vchannel. Each committed message is"
            " written exactly once across any number of runs that share the checkpoint,"
            " however they end. Prints one line per micro-batch. Needs Java and the"
            " walsvc[spark] extra; on a cluster every executor needs walsvc installed."
        ),
    )
    flush.add_argument("--url", help="WAL URL: file:///path, kafka://host:port, pulsar://...")
    flush.add_argument("--pchannels", help="pchannels to flush, comma-separated")
    flush.add_argument(
        "--to",
        metavar="PATH",
        help="output directory: a local path shared with the executors, or a Hadoop URI",
    )
    flush.add_argument(
        "--checkpoint", metavar="DIR", help="Spark checkpoint (default: PATH/_walsvc_checkpoint)"
    )
    flush.add_argument(
        "--master",
        help="Spark master: local[*] (default), spark://host:port, ... (under spark-submit:"
        " spark-submit's --master)",
    )
    flush.add_argument(
        "--once",
        action="store_true",
        help="flush what the log holds now, then exit (default: follow the log until Ctrl-C)",
    )
    flush.add_argument(
        "--interval",
        type=_seconds,
        default=5.0,
        help="seconds between micro-batches when following (%(default)s)",
    )
    flush.add_argument(
        "--max-records-per-trigger",
        type=int_at_least(1),
        metavar="N",
        help="log records one micro-batch covers at most (default: all there are)",
    )
    flush.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="walsvc source option: vchannels=v0,v1  types=INSERT  backend.connect_timeout=5 ...",
    )
    flush.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark configuration, as spark-submit --conf",
    )
    flush.add_argument(
        "--spark-log-level",
        default="ERROR",
        choices=("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"),
        help="Spark's log level once it runs (%(default)s)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {text}")
    return value


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a dict, or ``UsageError`` naming the bad one."""
    pairs: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} takes KEY=VALUE, not {text!r}")
        pairs[key.strip()] = value
    return pairs


@final
@dataclass(frozen=True, slots=True)
class _FlushArgs:
    url: str
    pchannels: str
    to: str
    checkpoint: str | None
    master: str | None
    once: bool
    interval: float
    max_records_per_trigger: int | None
    source_options: dict[str, str]
    spark_conf: dict[str, str]
    spark_log_level: str

    @classmethod
    def parse(cls, args: argparse.Namespace) -> _FlushArgs:
        # Checked here, not by argparse, so that a missing one is a one-line error.
        for flag, value in (("--url", args.url), ("--pchannels", args.pchannels)):
            if not value or not value.strip(" ,"):
                raise UsageError(f"{flag} is required (walsvc flush --help)")
        if not args.to:
            raise UsageError("--to is required: the output directory (walsvc flush --help)")
        return cls(
            url=args.url,
            pchannels=args.pchannels,
            to=args.to,
            checkpoint=args.checkpoint,
            master=args.master,
            once=args.once,
            interval=args.interval,
            max_records_per_trigger=args.max_records_per_trigger,
            source_options=_pairs(args.option, "--option"),
            spark_conf=_pairs(args.conf, "--conf"),
            spark_log_level=args.spark_log_level,
        )


def run_flush_command(args: argparse.Namespace) -> int:
    """Run ``walsvc flush`` with parsed ``args``; return the exit status."""
    try:
        import walsvc.spark as walsvc_spark
    except ImportError as exc:
        print(
            f"error: walsvc flush needs the spark extra (pip install 'walsvc[spark]'): {exc}",
            file=sys.stderr,
        )
        return 2
    try:
        job = _FlushArgs.parse(args)
        # Before Spark starts (seconds): bad options, an unknown scheme, a missing
        # pchannel or an unreachable broker fail fast, with one line (the backends keep
        # their client libraries quiet about what walsvc reports: docs/logging.md).
        walsvc_spark.check_source(
            job.url,
            job.pchannels,
            max_records_per_trigger=job.max_records_per_trigger,
            **job.source_options,
        )
    except (WALError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    try:
        return _run_flush(job)
    except KeyboardInterrupt:  # while Spark starts; once the query runs, Ctrl-C stops it
        print("interrupted", file=sys.stderr)
        return 130


def _run_flush(job: _FlushArgs) -> int:
    """Start Spark and the query, print progress until it ends; the exit status."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    import walsvc.spark as walsvc_spark

    # Python workers (executors, and the driver-side process that plans micro-batches)
    # run PYSPARK_PYTHON; by default, this interpreter, which has walsvc.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("walsvc flush").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if job.master is not None:  # else local[*], or spark-submit's --master
        builder = builder.master(job.master)
    for key, value in job.spark_conf.items():
        builder = builder.config(key, value)
    started = time.perf_counter()
    session = builder.getOrCreate()
    try:
        session.sparkContext.setLogLevel(job.spark_log_level)
        checkpoint = job.checkpoint or walsvc_spark.default_checkpoint(job.to)
        mode = (
            "once: what the log holds now"
            if job.once
            else f"following the log, a micro-batch every {job.interval:g} s; Ctrl-C stops"
        )
        ui = session.sparkContext.uiWebUrl
        print(f"walsvc flush: {job.url} [{job.pchannels}] -> {job.to}, by vchannel", flush=True)
        print(f"  checkpoint {checkpoint}; {mode}", flush=True)
        print(
            f"  spark {session.version}, master {session.sparkContext.master}"
            f"{'' if ui is None else f', UI {ui}'}",
            flush=True,
        )
        batches: list[walsvc_spark.BatchProgress] = []

        def show(batch: walsvc_spark.BatchProgress) -> None:
            batches.append(batch)
            print(batch.describe(), flush=True)

        query = walsvc_spark.start_flush(
            session,
            url=job.url,
            pchannels=job.pchannels,
            to=job.to,
            checkpoint=checkpoint,
            available_now=job.once,
            trigger_interval=f"{job.interval:g} seconds",
            max_records_per_trigger=job.max_records_per_trigger,
            query_name="walsvc_flush",
            **job.source_options,
        )
        # Ctrl-C (or SIGTERM) only sets a flag the watch polls: pyspark's own SIGINT
        # handler calls into the JVM from inside the signal handler, on the connection
        # the interrupted call is using, and logs the tracebacks that causes.
        stop = threading.Event()
        stopped_by: list[int] = []

        def request_stop(signum: int, _frame: object) -> None:
            stopped_by.append(signum)
            stop.set()

        handlers = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            walsvc_spark.watch_progress(query, show, stop=stop)
        except (Py4JError, OSError):
            if not stopped_by:
                raise
            # A SIGTERM sent to the whole process group stopped the JVM as well.
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            with contextlib.suppress(Py4JError, OSError):  # the JVM may be gone (above)
                if query.isActive:
                    query.stop()
        if stopped_by:
            print(f"stopped: {_flush_summary(batches, started)}", file=sys.stderr, flush=True)
            return 128 + stopped_by[0]  # 130 for Ctrl-C
        print(f"done: {_flush_summary(batches, started)}", flush=True)
        return 0
    except WALError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StreamingQueryException as exc:
        print(f"error: the flush query failed: {_first_cause(str(exc))}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(Py4JError, OSError):  # the JVM may be gone already
            session.stop()


def _flush_summary(batches: Sequence[Any], started: float) -> str:
    """``N micro-batches, R rows in S s; up to p0 file:9, p1 file:7``."""
    rows = sum(b.rows for b in batches)
    plural = "" if len(batches) == 1 else "es"
    seconds = time.perf_counter() - started
    text = f"{len(batches):,} micro-batch{plural}, {rows:,} rows in {seconds:.1f} s"
    if not batches:
        return f"{text}; nothing new since the checkpoint"
    ends = ", ".join(f"{p} {i}" for p, i in batches[-1].end.items())
    return f"{text}; up to {ends}"


def _first_cause(message: str) -> str:
    """The line of a Spark error that says what went wrong: the last exception line of a
    Python traceback it carries (``walsvc.spark._ranges.RangeStalled: ...``), else its
    first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if raised:
        return raised[-1]
    return lines[0] if lines else "(no message)"


#: A Python traceback's last line: ``module.ExceptionName: message``.
_EXCEPTION_LINE: Final = re.compile(r"^(?:walsvc\.[\w.]+|[\w.]*(?:Error|Exception)): ")
