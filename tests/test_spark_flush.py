"""The flush job (``walsvc.spark.flush``/``start_flush``, ``walsvc flush``): WAL -> Parquet
partitioned by vchannel, each committed message exactly once, checked against what
``WAL.read`` delivers: run in-process twice around a transaction that spans the runs;
run as a separate process, SIGKILLed in the middle of a micro-batch, restarted, stopped
with Ctrl-C and run once more; submitted with ``spark-submit`` to a standalone master and
worker on loopback; and given bad input."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from _spark import read_all, spark
from _spark_cluster import free_port, spark_cluster, spark_env, spark_home, stop_process

import walsvc
from walsvc import WAL, ImmutableMessage, Message, MessageType
from walsvc.apps._cli import main as cli
from walsvc.spark import (
    CHECKPOINT_NAME,
    FLUSH_APP,
    BatchProgress,
    default_checkpoint,
    flush,
    flushed_files,
    read_flushed,
    start_flush,
)
from walsvc.testing._tether import tethered

# Fixtures imported from the helper modules (pytest finds them by name here).
__all__ = ("spark",)

#: (pchannel, message_id, timetick, vchannel, type, properties, payload, txn_id)
Row = tuple[str, str, int, str, int, tuple[tuple[str, str], ...], bytes, int | None]

#: Seconds a flush subprocess may take (JVM start, every micro-batch) before the test fails.
JOB_TIMEOUT = 300.0
_BATCH_LINE = "batch "


async def fill(wal: WAL, r: int, plain: int = 60) -> None:
    """One round of what a flush must get right: plain messages on three vchannels and
    the broadcast vchannel, properties, an application type, a committed transaction with
    a plain append between its bodies, and a rolled-back transaction."""
    await wal.append_many(
        Message(
            payload=f"{wal.pchannel}-r{r}-{i}".encode(),
            vchannel=f"v{i % 3}" if i % 7 else "",
            properties={"i": str(i)} if i % 4 == 0 else {},
            type=10001 if i % 11 == 5 else MessageType.INSERT,
        )
        for i in range(plain)
    )
    committed = await wal.begin_txn("v1")
    await committed.append(Message(payload=f"txn{r}-a".encode(), vchannel="v1"))
    await wal.append(Message(payload=f"between{r}".encode(), vchannel="v2"))
    await committed.append(Message(payload=f"txn{r}-b".encode(), vchannel="v1"))
    await committed.commit()
    doomed = await wal.begin_txn("v2")
    await doomed.append(Message(payload=f"gone{r}".encode(), vchannel="v2"))
    await doomed.rollback()


def fill_rounds(url: str, pchannel: str, rounds: Iterable[int], plain: int = 60) -> None:
    """``fill`` rounds through one read-write open of ``pchannel``."""

    async def main() -> None:
        async with await walsvc.open_wal(url, pchannel) as wal:
            for r in rounds:
                await fill(wal, r, plain)

    asyncio.run(main())


def expected_rows(pchannel: str, delivered: Sequence[ImmutableMessage]) -> list[Row]:
    """The rows of ``delivered`` (``WAL.read`` output): each committed transaction's
    bodies, at the commit's timetick, with its id; every other message but TimeTicks."""
    rows: list[Row] = []
    for m in delivered:
        if m.type == MessageType.TIME_TICK:
            continue
        body = m.body if m.type == MessageType.TXN else (m,)
        rows += [
            (
                pchannel,
                b.message_id.marshal(),
                m.timetick,
                b.vchannel,
                int(b.type),
                tuple(sorted(b.properties.items())),
                bytes(b.payload),
                None if b.txn is None else b.txn.txn_id,
            )
            for b in body
        ]
    return rows


def expected(url: str, pchannels: Sequence[str]) -> list[Row]:
    """Every row the flush of ``pchannels`` must have written by now."""
    return [row for p in pchannels for row in expected_rows(p, read_all(url, p))]


def flushed(spark: Any, to: str) -> list[Row]:
    """The rows committed in ``to`` (read through the sink's ``_spark_metadata`` log)."""
    return [
        (
            r.pchannel,
            r.message_id,
            r.timetick,
            r.vchannel,
            r.type,
            tuple(sorted(r.properties.items())),
            bytes(r.payload),
            r.txn_id,
        )
        for r in read_flushed(spark, to).collect()
    ]


def check_exactly_once(spark: Any, to: str, want: list[Row]) -> list[Row]:
    """``to`` holds each row of ``want`` once and nothing else, each in the directory of
    its vchannel (the broadcast vchannel in Spark's null partition)."""
    got = flushed(spark, to)
    twice = [key for key, n in Counter((r[0], r[1]) for r in got).items() if n > 1]
    assert not twice, f"rows written more than once: {twice[:10]}"
    missing = Counter(want) - Counter(got)
    extra = Counter(got) - Counter(want)
    assert not missing, (
        f"{len(got)} rows flushed, {len(want)} expected; missing {list(missing)[:5]}"
    )
    assert not extra, (
        f"{len(got)} rows flushed, {len(want)} expected; missing {list(missing)[:5]},"
        f" unexpected {list(extra)[:5]}"
    )
    from pyspark.sql import functions as F

    placed = (
        spark.read.parquet(to)
        .select("vchannel", F.input_file_name().alias("file"))
        .distinct()
        .collect()
    )
    for row in placed:
        directory = f"vchannel={row.vchannel or '__HIVE_DEFAULT_PARTITION__'}"
        assert Path(row.file).parent.name == directory, (row.vchannel, row.file)
    assert {p.name for p in Path(to).glob("vchannel=*")} >= {
        f"vchannel={v}" for v in ("v0", "v1", "v2", "__HIVE_DEFAULT_PARTITION__")
    }
    return got


# -- in-process --------------------------------------------------------------------------


def test_flush_writes_each_committed_message_once_partitioned_by_vchannel(
    spark: Any, tmp_path: Path
) -> None:
    """Two flushes into one directory, around a transaction that is open during the
    first and committed before the second: every committed message once, the open one's
    bodies only after its commit, nothing rolled back; the second run goes on from the
    first's offsets."""
    url, to, pchannels = f"file://{tmp_path / 'wal'}", str(tmp_path / "out"), ["p0", "p1"]
    seen: list[BatchProgress] = []
    with asyncio.Runner() as writer:  # one writer for both runs keeps the transaction open
        wals = [writer.run(walsvc.open_wal(url, p)) for p in pchannels]
        for wal in wals:
            writer.run(fill(wal, 0))
        spanning = writer.run(wals[0].begin_txn("v0", keepalive=600))
        writer.run(spanning.append(Message(payload=b"spanning-a", vchannel="v0")))

        first = flush(
            spark,
            url=url,
            pchannels="p0,p1",
            to=to,
            max_records_per_trigger=50,
            on_batch=seen.append,
        )
        assert seen == first
        assert len(first) >= 3, first  # 2 x ~70 records, 50 per micro-batch
        assert [b.batch_id for b in first] == list(range(len(first)))
        rows = check_exactly_once(spark, to, expected(url, pchannels))
        assert not any(r[6].startswith(b"spanning") for r in rows)

        writer.run(spanning.append(Message(payload=b"spanning-b", vchannel="v0")))
        writer.run(spanning.commit())
        for wal in wals:
            writer.run(fill(wal, 1))
        for wal in wals:
            writer.run(wal.aclose())

    second = flush(spark, url=url, pchannels=["p0", "p1"], to=to, max_records_per_trigger=50)
    assert second[0].batch_id == first[-1].batch_id + 1
    assert second[0].start == first[-1].end  # from the checkpoint, not from the start
    rows = check_exactly_once(spark, to, expected(url, pchannels))
    assert sum(b.rows for b in first + second) == len(rows)
    spans = [r for r in rows if r[6].startswith(b"spanning")]
    assert sorted(r[6] for r in spans) == [b"spanning-a", b"spanning-b"]
    assert {r[7] for r in spans} == {spanning.txn_id}
    assert not any(r[6].startswith(b"gone") for r in rows)
    assert (Path(to) / CHECKPOINT_NAME / "commits").is_dir()  # the default checkpoint

    # Nothing new: a third run plans no micro-batch.
    assert flush(spark, url=url, pchannels="p0,p1", to=to) == []
    # A checkpoint that does not know the batches in ``to`` would make the sink skip
    # batch numbers it logged: refused before anything starts.
    with pytest.raises(walsvc.InvalidArgument, match="_spark_metadata"):
        start_flush(spark, url=url, pchannels="p0", to=to, checkpoint=str(tmp_path / "new"))


def test_flushed_files_are_the_files_spark_reads(spark: Any, tmp_path: Path) -> None:
    """``flushed_files`` on a real flush's output, its sink log compacted every 2 batches
    and the batch files a compaction covers cleaned up at once: the files Spark reads
    there, not a file no log names, and pyarrow reads every flushed row from them."""
    import pyarrow.parquet as pq

    url, to = f"file://{tmp_path / 'wal'}", tmp_path / "out"
    fill_rounds(url, "p0", range(2), plain=40)
    conf = {
        "spark.sql.streaming.fileSink.log.compactInterval": "2",
        "spark.sql.streaming.fileSink.log.cleanupDelay": "0",
    }
    before = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        batches = flush(spark, url=url, pchannels="p0", to=str(to), max_records_per_trigger=25)
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    assert len(batches) >= 4, batches
    assert any(p.suffix == ".compact" for p in (to / "_spark_metadata").iterdir())
    files = flushed_files(to)
    # A micro-batch that died before its commit leaves a file no log names.
    stray = Path(files[0]).with_name("part-99999-stray.snappy.parquet")
    stray.write_bytes(Path(files[0]).read_bytes())
    assert flushed_files(to) == files
    assert len(set(files)) == len(files)
    read_by_spark = {
        urlsplit(f).path for f in spark.read.schema("timetick long").parquet(str(to)).inputFiles()
    }
    assert set(files) == {unquote(p) for p in read_by_spark}
    assert str(stray) not in files
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    assert rows == read_flushed(spark, str(to)).count() == sum(b.rows for b in batches)


def test_flush_options_and_progress_reports() -> None:
    """The parts of the API that need no Spark: the default checkpoint and how one
    progress report reads."""
    assert default_checkpoint("/data/out/") == f"/data/out/{CHECKPOINT_NAME}"
    assert default_checkpoint("s3a://b/out") == f"s3a://b/out/{CHECKPOINT_NAME}"
    progress = {
        "batchId": 7,
        "numInputRows": 1000,
        "batchDuration": 520,
        "processedRowsPerSecond": 1923.1,
        "sources": [
            {"startOffset": {"p0": "file:99", "p1": None}, "endOffset": {"p0": "file:1099"}}
        ],
    }
    batch = BatchProgress.from_progress(progress)
    assert batch is not None
    assert batch.describe() == (
        "batch 7: 1,000 rows in 0.52 s (1,923 rows/s); p0 file:99 -> file:1099"
    )
    idle = {**progress, "sources": [{"startOffset": {"p0": "a"}, "endOffset": {"p0": "a"}}]}
    assert BatchProgress.from_progress(idle) is None


# -- a separate process: SIGKILL mid-batch, restart, Ctrl-C ---------------------------------


def _flush_command(url: str, to: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "walsvc",
        "flush",
        "--url",
        url,
        "--pchannels",
        "p0",
        "--to",
        str(to),
        "--max-records-per-trigger",
        "40",
        "--interval",
        "0.2",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.memory=1g",
        *extra,
    ]


def _start_job(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The flush job ``command``, in a process group of its own (the test freezes and
    kills the group), killed if this worker dies (a crashed worker runs no ``finally``;
    a job left running was seen flushing on for 45 minutes). Its JVM ends with it: the
    gateway exits when its Python driver's pipe closes."""
    tied, fds = tethered(command)
    with log.open("wb") as out:
        return subprocess.Popen(
            tied,
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=spark_env(),
            cwd=log.parent,
            start_new_session=True,
        )


def _numbered(directory: Path) -> set[int]:
    try:
        return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}
    except FileNotFoundError:
        return set()


def _wait_until(what: str, ready: Any, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT
    while not ready():
        if process.poll() is not None:
            pytest.fail(
                f"the flush exited ({process.returncode}) before {what}:\n{log.read_text()}"
            )
        if time.monotonic() > deadline:
            stop_process(process)
            pytest.fail(f"no {what} within {JOB_TIMEOUT:g} s:\n{log.read_text()}")
        time.sleep(0.02)


def _group_gone(pgid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _logged_end(checkpoint: Path, batch: int) -> dict[str, str | None]:
    """The end offsets Spark logged for ``batch`` before running it."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return dict(json.loads(lines[-1]))


def test_a_flush_killed_mid_batch_and_restarted_writes_each_message_once(
    spark: Any, tmp_path: Path
) -> None:
    """``walsvc flush`` following the log, SIGKILLed (with its JVM) while a micro-batch is
    planned but not committed; more is appended; a restart re-runs that micro-batch with
    the offsets Spark logged for it, goes on to the end of the log and stops on Ctrl-C.
    The Parquet output then holds each committed message exactly once."""
    url, to = f"file://{tmp_path / 'wal'}", tmp_path / "out"
    checkpoint = to / CHECKPOINT_NAME
    fill_rounds(url, "p0", range(3), plain=40)  # ~150 records: 4 micro-batches of 40

    log1 = tmp_path / "run1.log"
    run1 = _start_job(_flush_command(url, to), log1)
    try:

        def in_flight() -> bool:
            # Two committed (so Parquet files exist), the next one planned.
            commits = _numbered(checkpoint / "commits")
            return len(commits) >= 2 and max(_numbered(checkpoint / "offsets")) > max(commits)

        def frozen_in_flight() -> bool:
            # Freeze the job, then look again: the batch may have committed meanwhile.
            if not in_flight():
                return False
            os.killpg(run1.pid, signal.SIGSTOP)
            if in_flight():
                return True
            os.killpg(run1.pid, signal.SIGCONT)
            return False

        _wait_until("a micro-batch in flight after two commits", frozen_in_flight, run1, log1)
        os.killpg(run1.pid, signal.SIGKILL)
        run1.wait(30)
    finally:
        stop_process(run1)
    assert _group_gone(run1.pid), "the killed flush's process group is still alive"
    killed_in = max(_numbered(checkpoint / "offsets"))
    assert killed_in not in _numbered(checkpoint / "commits")
    logged = _logged_end(checkpoint, killed_in)

    fill_rounds(url, "p0", range(3, 5), plain=40)
    newest = asyncio.run(_latest(url, "p0"))
    log2 = tmp_path / "run2.log"
    run2 = _start_job(_flush_command(url, to), log2)
    try:
        _wait_until(
            f"a micro-batch up to the newest id {newest}",
            lambda: f"-> {newest}\n" in log2.read_text(),
            run2,
            log2,
        )
        run2.send_signal(signal.SIGINT)
        status = run2.wait(JOB_TIMEOUT)
    finally:
        stop_process(run2)
    out2 = log2.read_text()
    assert status == 130, out2
    assert "\nstopped: " in out2, out2
    assert "Traceback" not in out2, out2
    batches = [line for line in out2.splitlines() if line.startswith(_BATCH_LINE)]
    assert batches[0].startswith(f"batch {killed_in}: "), out2  # the interrupted one, re-run
    assert batches[0].endswith(f"-> {logged['p0']}"), (logged, out2)
    check_exactly_once(spark, str(to), expected(url, ["p0"]))


async def _latest(url: str, pchannel: str) -> str:
    async with await walsvc.open_wal(url, pchannel, read_only=True) as wal:
        latest = await wal.latest_message_id()
    assert latest is not None
    return latest.marshal()


# -- a standalone cluster on loopback, through spark-submit ---------------------------------


def test_spark_submit_to_a_standalone_cluster(spark: Any, tmp_path: Path) -> None:
    url, to = f"file://{tmp_path / 'wal'}", tmp_path / "out"
    for pchannel in ("p0", "p1"):
        fill_rounds(url, pchannel, range(2))
    with spark_cluster(tmp_path / "cluster", cores=1, memory="1g") as cluster:
        submit = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            cluster.url,
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.executor.memory=512m",
            "--driver-memory",
            "1g",
            FLUSH_APP,
            "--url",
            url,
            "--pchannels",
            "p0,p1",
            "--to",
            str(to),
            "--once",
            "--max-records-per-trigger",
            "100",
        ]
        try:
            done = subprocess.run(
                submit,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=spark_env(),
                cwd=tmp_path,
                timeout=JOB_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(
                f"spark-submit did not finish in {JOB_TIMEOUT:g} s\n{cluster.logs()}\n{exc}"
            )
        report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-8000:]}\n{cluster.logs()}"
        assert done.returncode == 0, report
        assert f"master {cluster.url}" in done.stdout, report
        assert "\ndone: " in done.stdout, report
        # The tasks ran in an executor the worker launched for this application.
        assert list((tmp_path / "cluster" / "work").glob("app-*/*/stderr")), report
        daemons = [d.process for d in cluster.daemons]
    assert all(p.poll() is not None for p in daemons)  # stopped by pid, and reaped
    check_exactly_once(spark, str(to), expected(url, ["p0", "p1"]))


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "nope://x", "--pchannels", "p0"], "nope"),
        (["--url", "file:///tmp"], "--pchannels is required"),
        (["--url", "file:///tmp", "--pchannels", " , "], "--pchannels is required"),
        (["--pchannels", "p0"], "--url is required"),
        (["--url", "FILE", "--pchannels", "p0"], "no file WAL for pchannel 'p0'"),
        (
            [
                "--url",
                "kafka://127.0.0.1:PORT",
                "--pchannels",
                "p0",
                "-o",
                "backend.connect_timeout=1",
            ],
            "cannot reach Kafka at 127.0.0.1:PORT",
        ),
        (["--url", "FILE", "--pchannels", "p0", "-o", "backend.nosuch=1"], "nosuch"),
        (["--url", "FILE", "--pchannels", "p0", "-o", "nosuch=1"], "unknown walsvc data source"),
        (["--url", "FILE", "--pchannels", "p0", "-o", "types=BOGUS"], "BOGUS"),
        (["--url", "FILE", "--pchannels", "p0", "-o", "url=x"], "set by the flush itself"),
        (["--url", "FILE", "--pchannels", "p0", "--option", "novalue"], "KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
) -> None:
    """Checked before Spark starts: no JVM, no traceback, one line on stderr."""
    port = str(free_port())
    args = [
        a.replace("FILE", f"file://{tmp_path}")
        .replace("PORT", port)
        .replace("backend.x=1", "backend.connect_timeout=1")
        for a in args
    ]
    to = [] if "--to" in args else ["--to", str(tmp_path / "out")]
    status = cli(["flush", *args, *to])
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("error: "), err
    assert message.replace("PORT", port) in err, err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_broker_is_one_line_from_the_command() -> None:
    """As a person sees it: the client library's own log lines do not repeat the error."""
    command = [sys.executable, "-m", "walsvc", "flush", "--url", f"kafka://127.0.0.1:{free_port()}"]
    command += ["--pchannels", "p0", "--to", "out", "-o", "backend.connect_timeout=1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: cannot reach Kafka at 127.0.0.1:"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_missing_output_directory_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli(["flush", "--url", "file:///tmp", "--pchannels", "p0"])
    _, err = capsys.readouterr()
    assert status == 2
    assert err == "error: --to is required: the output directory (walsvc flush --help)\n"
