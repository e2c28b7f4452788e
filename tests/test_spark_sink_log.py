"""``walsvc.spark.flushed_files`` on hand-written Spark file-sink logs: compactions,
deletes, batch files a compaction made redundant (present or cleaned up), temporary
files, and logs it must refuse. Needs no Spark: the real flush's output is checked in
test_spark_flush.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from walsvc import CorruptRecord, InvalidArgument
from walsvc.spark import flushed_files


def entry(path: str, action: str = "add", *, is_dir: bool = False) -> str:
    """One log line as Spark's FileStreamSinkLog writes it."""
    return json.dumps(
        {
            "path": path,
            "size": 100,
            "isDir": is_dir,
            "modificationTime": 1,
            "blockReplication": 1,
            "blockSize": 33554432,
            "action": action,
        },
        separators=(",", ":"),
    )


def write_batch(out: Path, name: str, lines: Iterable[str], version: str = "v1") -> None:
    log = out / "_spark_metadata"
    log.mkdir(parents=True, exist_ok=True)
    (log / name).write_text("\n".join([version, *lines]))


def uri(out: Path, name: str) -> str:
    return f"file://{out}/{name}"


def test_batches_compactions_and_deletes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # Batches 0-2, then the compaction 3.compact (interval 4) holding 0-3 with one file
    # deleted, then batches 4 and 5 (5 deletes a file of batch 4).
    write_batch(out, "0", [entry(uri(out, "a.parquet"))])
    write_batch(out, "1", [entry(uri(out, "b.parquet")), entry(uri(out, "c.parquet"))])
    write_batch(out, "2", [])  # a micro-batch that wrote nothing
    write_batch(
        out,
        "3.compact",
        [
            entry(uri(out, "a.parquet")),
            entry(uri(out, "b.parquet")),
            entry(uri(out, "c.parquet")),
            entry(uri(out, "d.parquet")),
            entry(uri(out, "b.parquet"), "delete"),
            entry(uri(out, "subdir"), is_dir=True),
        ],
    )
    write_batch(out, "4", [entry(uri(out, "e.parquet")), entry(uri(out, "f.parquet"))])
    write_batch(
        out, "5", [entry(uri(out, "e.parquet"), "delete"), entry(uri(out, "g%20h.parquet"))]
    )
    # Left over by a batch file written by name swap, and a checksum: not batches.
    (out / "_spark_metadata" / ".6.3f2a.tmp").write_text("v1\n" + entry(uri(out, "x.parquet")))
    (out / "_spark_metadata" / ".0.crc").write_bytes(b"\0")
    # Batch 1 still says b was added: the compaction supersedes it.
    want = [
        str(out / n) for n in ("a.parquet", "c.parquet", "d.parquet", "f.parquet", "g h.parquet")
    ]
    assert flushed_files(out) == want
    assert flushed_files(str(out)) == want
    assert flushed_files(f"file://{out}") == want
    # Spark deletes the batch files a compaction covers: not needed.
    for name in ("0", "1", "2"):
        (out / "_spark_metadata" / name).unlink()
    assert flushed_files(out) == want
    # A newer compaction covers everything before it.
    write_batch(out, "7.compact", [entry(uri(out, "z.parquet"))])
    write_batch(out, "6", [])
    assert flushed_files(out) == [str(out / "z.parquet")]


def test_a_log_without_compaction_and_an_empty_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "_spark_metadata").mkdir(parents=True)
    assert flushed_files(out) == []
    write_batch(out, "0", [entry("s3a://bucket/out/vchannel=v0/part-0.parquet")])
    write_batch(out, "1", [entry(uri(out, "vchannel=v0/part-1.parquet"))])
    assert flushed_files(out) == [
        "s3a://bucket/out/vchannel=v0/part-0.parquet",
        str(out / "vchannel=v0/part-1.parquet"),
    ]


def test_logs_it_cannot_read_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no Spark file-sink log"):
        flushed_files(tmp_path)
    with pytest.raises(InvalidArgument, match="local directories"):
        flushed_files("s3a://bucket/out")
    cases: list[tuple[dict[str, list[str]], str, str]] = [
        ({"0": [], "2": []}, "v1", "batch 1 is missing"),
        ({"3.compact": [], "5": []}, "v1", "batch 4 is missing"),
        ({"0": []}, "v2", "newer than this reader's v1"),
        ({"0": []}, "{}", "not a log version"),
        ({"0": ["{not json"]}, "v1", "not a log entry"),
        ({"0": ['{"size": 1}']}, "v1", "without a path"),
        ({"0": [entry("file:///x", "rename")]}, "v1", "unknown action"),
    ]
    for number, (batches, version, complaint) in enumerate(cases):
        out = tmp_path / f"case{number}"
        for name, lines in batches.items():
            write_batch(out, name, lines, version)
        with pytest.raises(CorruptRecord, match=complaint):
            flushed_files(out)


def test_it_imports_no_pyspark(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_batch(out, "0", [entry(uri(out, "a.parquet"))])
    probe = (
        "import sys, walsvc.spark\n"
        f"print(walsvc.spark.flushed_files({str(out)!r}))\n"
        "print(sorted(m for m in ('pyspark', 'py4j', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.splitlines() == [repr([str(out / "a.parquet")]), "[]"]
