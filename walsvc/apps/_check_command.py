"""``walsvc check URL PCHANNEL [--repair [--force]] [--json]``: verify a local log frame
by frame, and repair what a writer's open may not repair by itself.

Exit status: 0 when the log is sound (or was repaired), 1 when damage was found and left
as it is (no ``--repair``, or acknowledged records damaged without ``--force``), 2 for bad
usage or a log that cannot be read at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from walsvc.backends._file._check import CheckReport, RepairReport, check, repair
from walsvc.core._errors import CorruptRecord, InvalidArgument, WALError

__all__ = ("add_check_parser", "run_check_command")


def add_check_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``check`` subcommand and its arguments to ``commands``."""
    command = commands.add_parser(
        "check",
        help="verify every frame of a file:// log; --repair what recovery may not",
        description=(
            "Read every frame of every segment of a file:// pchannel and report damage with"
            " its file and byte offset (exit status 1). --repair rebuilds a missing or"
            " damaged head file from the segments and cuts a torn write after the durable"
            " end; it changes nothing if acknowledged records are damaged, unless --force,"
            " which cuts the log before the first damage and says which records it drops"
            " (their ids will be handed out again). Stop every writer first."
        ),
    )
    command.add_argument("url", help="file:///path or file://relative/path")
    command.add_argument("pchannel")
    command.add_argument("--repair", action="store_true", help="repair what can be repaired")
    command.add_argument(
        "--force", action="store_true", help="with --repair: cut damaged acknowledged records"
    )
    command.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def run_check_command(args: argparse.Namespace) -> int:
    """Run ``walsvc check`` with parsed ``args``; returns the exit status."""
    try:
        if args.force and not args.repair:
            raise InvalidArgument("--force only goes with --repair")
        path = _pchannel_path(args.url, args.pchannel)
        report = check(path)
        repaired: RepairReport | None = None
        refused: str | None = None
        if args.repair and not report.ok:
            try:
                repaired = repair(path, force=args.force)
            except CorruptRecord as exc:
                refused = str(exc)
            else:
                report = check(path)
    except (WALError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_as_json(report, repaired, refused)))
    else:
        _print(report, repaired, refused)
    return 0 if report.ok else 1


def _pchannel_path(url: str, pchannel: str) -> str:
    scheme, sep, location = url.partition("://")
    if scheme != "file" or not sep or not location:
        raise InvalidArgument(f"walsvc check verifies file:// logs, not {url!r}")
    path = os.path.abspath(os.path.join(os.path.expanduser(location), pchannel))
    if not os.path.isdir(path):
        raise InvalidArgument(f"no file WAL for pchannel {pchannel!r} at {path}")
    return path


def _print(report: CheckReport, repaired: RepairReport | None, refused: str | None) -> None:
    records = sum(s.records for s in report.segments)
    size = sum(s.size for s in report.segments)
    print(f"{report.path}: {len(report.segments)} segments, {records} records, {size} bytes")
    head = report.head
    if head is not None:
        print(f"head: term {head.term}, records {head.first_seq} to {head.durable_end - 1} durable")
    if report.head_problem is not None:
        print(f"head: {report.head_problem}")
    for damage in report.damage:
        kind = "acknowledged" if damage.acknowledged else "never acknowledged"
        print(
            f"damage: {damage.path} at byte {damage.offset}: {damage.detail} (records from"
            f" {damage.first_seq}, {kind})"
        )
    if report.torn_tail:
        print(
            f"torn write: {report.torn_tail} bytes after byte {report.end_offset} of"
            f" {report.end_path} (never acknowledged; a writer's open cuts it)"
        )
    if repaired is not None:
        for action in repaired.actions:
            print(f"repaired: {action}")
    if refused is not None:
        print(f"not repaired: {refused}")
    print("ok" if report.ok else "problems found")


def _as_json(
    report: CheckReport, repaired: RepairReport | None, refused: str | None
) -> dict[str, Any]:
    head = report.head
    return {
        "path": report.path,
        "ok": report.ok,
        "head": None if head is None else head._asdict(),
        "head_problem": report.head_problem,
        "segments": [
            {"path": s.path, "first_seq": s.first_seq, "records": s.records, "bytes": s.size}
            for s in report.segments
        ],
        "damage": [
            {
                "path": d.path,
                "offset": d.offset,
                "detail": d.detail,
                "first_seq": d.first_seq,
                "resumes_at": d.resumes_at,
                "acknowledged": d.acknowledged,
            }
            for d in report.damage
        ],
        "torn_tail_bytes": report.torn_tail,
        "repaired": None if repaired is None else repaired.actions,
        "dropped": None if repaired is None else repaired.dropped,
        "refused": refused,
    }
