"""The files a flush committed, read from Spark's file-sink log without Spark: no JVM, and
no pyspark import (this module imports only the standard library and walsvc's errors).

Spark's file sink (``FileStreamSinkLog``, a ``CompactibleFileStreamLog``) keeps the log
in ``<output>/_spark_metadata``: one file per committed micro-batch, named by the batch
number (``0``, ``1``, ...), written whole (to a temporary name, then renamed). A file is
a version line (``v1``) followed by one JSON object per line, one per file the batch
wrote or removed::

    v1
    {"path":"file:///data/parquet/vchannel=v0/part-00000-....snappy.parquet",
     "size":1234,"isDir":false,"modificationTime":...,"blockReplication":1,
     "blockSize":33554432,"action":"add"}

Every ``compactInterval`` batches (``spark.sql.streaming.fileSink.log.compactInterval``,
default 10) the batch's file is a compaction instead, ``N.compact``: every entry of the
batches up to N, so the log's content is the newest compaction (if any) plus the batch
files after it; Spark may delete the batch files a compaction covers. The committed files
are the ``"add"`` entries of that content minus every path an ``"delete"`` entry names
(Spark's ``FileStreamSinkLog.compactLogs``), directories left out, each path once.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from walsvc.core._errors import CorruptRecord, InvalidArgument

__all__ = ("SINK_LOG", "flushed_files")

#: The sink's log of committed files, inside the output directory.
SINK_LOG: Final = "_spark_metadata"
#: The newest log version this reader understands (Spark 2.x through 4.x write ``v1``).
_VERSION: Final = 1
_COMPACT: Final = ".compact"
_BATCH_FILE: Final = re.compile(r"(\d+)(\.compact)?")
#: Listings tried when a batch file vanishes while read (a concurrent compaction's cleanup).
_ATTEMPTS: Final = 5


def flushed_files(path: str | os.PathLike[str]) -> list[str]:
    """The data files a flush committed in the output directory ``path`` (a local path
    or ``file:`` URL), as local paths, oldest batch first: the files Spark itself reads
    there (``read_flushed``, ``spark.read.parquet``), for readers that list a directory
    themselves (pyarrow, DuckDB, pandas) and would also pick up the files of a
    micro-batch that died before its commit. Reads ``<path>/_spark_metadata`` (the
    module docstring has the format), honouring compactions and deletes; imports neither
    pyspark nor anything that starts a JVM. Files on other filesystems (a log written
    through ``s3a://``) are returned as the URIs the log holds.

    ``[]`` if nothing was committed yet; ``InvalidArgument`` if ``path`` has no sink log;
    ``CorruptRecord`` if the log is unreadable (a batch file missing before the newest,
    a version newer than ``v1``, a line that is not an entry).
    """
    log = _local_dir(path) / SINK_LOG
    if not log.is_dir():
        raise InvalidArgument(
            f"{path} holds no Spark file-sink log ({SINK_LOG}): not a flush output"
        )
    for _ in range(_ATTEMPTS):
        batches = _batches(log)
        try:
            return _committed(log, batches)
        except FileNotFoundError:
            continue  # compacted and cleaned up meanwhile: list again
    raise CorruptRecord(f"{log}: batch files kept vanishing while read ({_ATTEMPTS} listings)")


def _local_dir(path: str | os.PathLike[str]) -> Path:
    text = os.fspath(path)
    if text.startswith("file:"):
        return Path(unquote(urlsplit(text).path))
    scheme = urlsplit(text).scheme
    if len(scheme) > 1:  # hdfs://, s3a://, ... (not C:\ paths)
        raise InvalidArgument(f"flushed_files reads local directories, not {text!r}")
    return Path(text)


def _batches(log: Path) -> dict[int, str]:
    """Batch number -> file name, for every batch file in ``log`` (temporary files,
    ``.crc`` and the like left out). A compaction wins over a plain file of its number."""
    found: dict[int, str] = {}
    for entry in os.listdir(log):
        match = _BATCH_FILE.fullmatch(entry)
        if match is None:
            continue
        number = int(match.group(1))
        if match.group(2) or number not in found:
            found[number] = entry
    return found


def _committed(log: Path, batches: dict[int, str]) -> list[str]:
    if not batches:
        return []
    newest = max(batches)
    compactions = [n for n, name in batches.items() if name.endswith(_COMPACT)]
    first = max(compactions, default=0)
    missing = [n for n in range(first, newest + 1) if n not in batches]
    if missing:
        raise CorruptRecord(
            f"{log}: batch {missing[0]} is missing (the log runs from"
            f" {batches[first]} to {batches[newest]})"
        )
    added: list[str] = []
    deleted: set[str] = set()
    for number in range(first, newest + 1):
        name = batches[number]
        text = (log / name).read_text(encoding="utf-8")  # FileNotFoundError: list again
        for action, path, is_dir in _entries(log / name, text):
            if action == "delete":
                deleted.add(path)
            elif not is_dir:
                added.append(path)
    kept = dict.fromkeys(p for p in added if p not in deleted)
    return [_local_path(p) for p in kept]


def _entries(file: Path, text: str) -> list[tuple[str, str, bool]]:
    """The entries of one batch file, after its version line: (action, path, isDir)."""
    lines = text.split("\n")
    head = lines[0].strip()
    if not re.fullmatch(r"v\d+", head):
        raise CorruptRecord(f"{file}: the first line is {head[:40]!r}, not a log version (v1)")
    if int(head[1:]) > _VERSION:
        raise CorruptRecord(
            f"{file}: log version {head} is newer than this reader's v{_VERSION}"
            " (written by a newer Spark)"
        )
    entries = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise CorruptRecord(f"{file}:{number}: not a log entry: {exc}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise CorruptRecord(f"{file}:{number}: a log entry without a path: {line[:80]!r}")
        action = entry.get("action", "add")
        if action not in ("add", "delete"):
            raise CorruptRecord(f"{file}:{number}: unknown action {action!r}")
        entries.append((action, entry["path"], entry.get("isDir") is True))
    return entries


def _local_path(uri: str) -> str:
    """A ``file:`` URI as a local path (Spark writes them percent-encoded); any other
    URI (or a bare path) as it is."""
    return unquote(urlsplit(uri).path) if uri.startswith("file:") else uri
