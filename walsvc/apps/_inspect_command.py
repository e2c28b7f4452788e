"""``walsvc inspect URL PCHANNEL``: what one pchannel holds, in one report.

Opens the log read-only and reports:

- the first and the newest retained record (id, timetick, its time, writer term) and,
  where ids are sequence numbers, how many records lie between them;
- the writer: the term of the newest record; on ``file://`` also the head file's term
  (the newest read-write open, which may have written nothing yet) and who opened it
  (the writer note);
- ``file://``: the segment files and their sizes, and what the head says (durable end,
  first retained record);
- the open transactions: a BeginTxn in the log without its CommitTxn or RollbackTxn
  (an interrupted writer's transaction stays open until the next writer's open rolls
  it back), with its vchannel, start and bodies so far;
- the durable subscriptions: each checkpoint, the scope it reads, and its lag behind
  the newest record: in timeticks and wall-clock time, and in records (every record
  after the checkpoint, of every vchannel, TimeTicks included) where ids are sequence
  numbers;
- the routing (``walsvc.node``): the newest version stored in the ``walsvc.routing``
  pchannel of the same log, or "none" when there is none (not looked up on
  ``pulsar://``, where a lookup may create the topic: "unknown");
- ``walsvc://``: the node (version, the log it serves, uptime) and what it says about
  the pchannel (its writer's term, last timetick, handles, streams, and its durable
  subscriptions with how many of the node's scanners read each), from the status
  request ``walsvc status`` makes, asking for subscriptions; the routing pchannel is
  read through the node. What the node does not report (segments; a subscription's
  lag in records) is printed as "unknown" (null in JSON).

What it reads, so that a large log costs no more than a small one: the newest record
and the first one (two positioned reads); the log from the last-confirmed id of the
newest record to the end (every transaction still open began there or later, as the
WAL's recovery on open relies on: usually a few records; a transaction left open for
long makes it longer); per subscription, the first record after its checkpoint (found
by the backend's search by timetick); and the routing pchannel, which is small. Every
read goes through the WAL's async API and its read budget, so the event loop is never
held. ``--json`` prints the report as one JSON object.

Exit status: 0, or 2 for bad usage or a log that cannot be opened or read
(``error: <message>``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any, Final

from walsvc.backends._file._backend import FileBackend
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import BackendUnavailable, InvalidArgument, WALError, WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, SequenceMessageId
from walsvc.core._message import ImmutableMessage, MessageType
from walsvc.core._timetick import physical_ms
from walsvc.node._routing import ROUTING_PCHANNEL, load_routings
from walsvc.remote._node_status import NodeStatus
from walsvc.remote._open import open_wal
from walsvc.remote._status import fetch_status
from walsvc.wal._api import WAL
from walsvc.wal._wal import LocalWAL

from ._cli_args import UsageError, add_node_options, event_loop, node_options
from ._cli_args import seconds as positive_seconds
from ._status_command import format_size, format_table
from ._tail_command import tick_time

__all__ = ("add_inspect_parser", "inspect_pchannel", "run_inspect_command")

_UNKNOWN: Final = "unknown"


def add_inspect_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walsvc inspect`` to the command line's subparsers."""
    parser = commands.add_parser(
        "inspect",
        help="report what a pchannel holds: records, writer, segments, txns, subscriptions",
        description=(
            "Report on one pchannel, read-only: first and newest record, writer term,"
            " segment files (file://), open transactions, durable subscriptions and their"
            " lag, routing version, and on walsvc:// what the node says about it. Reads"
            " the ends of the log, not all of it."
        ),
    )
    parser.add_argument("url", help="file:///path, kafka://host:port, pulsar://..., walsvc://...")
    parser.add_argument("pchannel")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="S",
        help="give up after S seconds (%(default)s)",
    )
    add_node_options(parser)


def run_inspect_command(args: argparse.Namespace) -> int:
    """Run ``walsvc inspect``; return the exit status."""
    loop_factory, _ = event_loop()
    try:
        options = node_options(args.url, args)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            report = runner.run(
                _within(args.timeout, inspect_pchannel(args.url, args.pchannel, options))
            )
    except (WALError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print(format_report(report))
    return 0


async def _within(seconds: float, work: Any) -> Any:
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise BackendUnavailable(f"no complete answer within {seconds:g} s (--timeout)") from None


@dataclass(slots=True)
class _Txn:
    txn_id: int
    vchannel: str
    begin: ImmutableMessage
    bodies: int = 0
    body_bytes: int = 0
    keepalive_ms: int = 0


async def inspect_pchannel(url: str, pchannel: str, options: dict[str, Any]) -> dict[str, Any]:
    """The report ``walsvc inspect`` prints, as a JSON-ready dict (see the module
    docstring for what it holds and what it reads)."""
    node: NodeStatus | None = None
    wal = await open_wal(url, pchannel, read_only=True, **options)
    async with wal:
        if url.startswith("walsvc://"):  # asked once the node has the pchannel open
            node = await fetch_status(
                url, token=options.get("token"), tls=options.get("tls"), subscriptions=True
            )
        latest = await wal.latest_message_id()
        newest, first = await _ends(wal, latest)
        report: dict[str, Any] = {
            "url": url,
            "pchannel": pchannel,
            "latest_id": None if latest is None else latest.marshal(),
            "first": _record(first),
            "newest": _record(newest),
            "records": _count(first, newest),
        }
        writer: dict[str, Any] = {"newest_record_term": None if newest is None else newest.term}
        report["writer"] = writer
        report["file"] = None
        if isinstance(wal, LocalWAL) and isinstance(wal.backend, FileBackend):
            layout = await wal.backend.layout()
            head = layout.head
            writer["head_term"] = head.term
            writer["opened_by"] = layout.writer
            report["file"] = {
                "path": layout.path,
                "durable_end": head.durable_end,
                "first_seq": head.first_seq,
                "last_timetick": head.last_timetick,
                "bytes": sum(s.size for s in layout.segments),
                "segments": [
                    {"first_seq": s.first_seq, "path": s.path, "bytes": s.size}
                    for s in layout.segments
                ],
            }
        report["open_transactions"] = await _open_txns(wal, newest, latest)
        if isinstance(wal, LocalWAL):
            report["subscriptions"] = await _subscriptions(wal, newest)
            report["routing"] = await _routing(url, options)
        else:
            assert node is not None
            report["subscriptions"] = _node_subscriptions(node, pchannel, newest)
            # The node serves the routing pchannel of its log like any other; on
            # pulsar:// a lookup may create its topic there too.
            looked_up = not node.url.startswith("pulsar://")
            report["routing"] = await _routing(url, options) if looked_up else _UNKNOWN
    if node is not None:
        report["node"] = _node(node, pchannel)
        served = report["node"]["pchannel"]
        if served is not None:
            writer["node_term"] = served["term"]
    return report


async def _first_of(wal: WAL, deliver: DeliverPolicy) -> ImmutableMessage:
    async with wal.read(deliver, raw=True) as scanner:
        async for message in scanner:
            if message.persisted:  # a node's idle ticks are not records
                return message
    raise BackendUnavailable("the scanner stopped before the first record")  # closed under it


async def _ends(
    wal: WAL, latest: MessageId | None
) -> tuple[ImmutableMessage | None, ImmutableMessage | None]:
    """The newest and the first retained record (None, None: the log retains none)."""
    if latest is None:
        return None, None
    try:
        newest = await _first_of(wal, DeliverPolicy.start_from(latest))
    except WALTruncated:
        return None, None  # truncated to nothing: a read from the start would wait
    return newest, await _first_of(wal, DeliverPolicy.all())


def _record(message: ImmutableMessage | None) -> dict[str, Any] | None:
    if message is None:
        return None
    return {
        "id": message.message_id.marshal(),
        "timetick": message.timetick,
        "time": tick_time(message.timetick),
        "type": message.type.name,
        "term": message.term,
    }


def _count(first: ImmutableMessage | None, newest: ImmutableMessage | None) -> int | None:
    if first is None or newest is None:
        return 0
    a, b = first.message_id, newest.message_id
    if isinstance(a, SequenceMessageId) and isinstance(b, SequenceMessageId):
        return b.seq - a.seq + 1
    return None


_ENDS: Final = frozenset({MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})


async def _open_txns(
    wal: WAL, newest: ImmutableMessage | None, latest: MessageId | None
) -> list[dict[str, Any]]:
    """The transactions begun and not ended, reading from the newest record's
    last-confirmed id (every open transaction began there or later) to ``latest``."""
    if newest is None or latest is None:
        return []
    start = newest.last_confirmed_id
    try:
        found = await _scan_txns(
            wal, DeliverPolicy.all() if start is None else DeliverPolicy.start_from(start), latest
        )
    except WALTruncated:
        found = await _scan_txns(wal, DeliverPolicy.all(), latest)
    return [
        {
            "txn_id": t.txn_id,
            "vchannel": t.vchannel,
            "begin_id": t.begin.message_id.marshal(),
            "begin_timetick": t.begin.timetick,
            "begin_time": tick_time(t.begin.timetick),
            "keepalive_ms": t.keepalive_ms,
            "bodies": t.bodies,
            "body_bytes": t.body_bytes,
            "term": t.begin.term,
        }
        for t in found
    ]


async def _scan_txns(wal: WAL, deliver: DeliverPolicy, latest: MessageId) -> list[_Txn]:
    open_txns: dict[int, _Txn] = {}
    async with wal.read(deliver, raw=True) as scanner:
        async for batch in scanner.batches():
            for message in batch:
                if not message.persisted:
                    continue
                txn = message.txn
                if txn is not None:
                    kind = message.type
                    if kind is MessageType.BEGIN_TXN:
                        open_txns[txn.txn_id] = _Txn(
                            txn.txn_id, message.vchannel, message, keepalive_ms=txn.keepalive_ms
                        )
                    elif kind in _ENDS:
                        open_txns.pop(txn.txn_id, None)
                    else:
                        entry = open_txns.get(txn.txn_id)
                        if entry is not None:
                            entry.bodies += 1
                            entry.body_bytes += len(message.payload)
                if not message.message_id < latest:
                    return list(open_txns.values())
    return list(open_txns.values())


async def _subscriptions(
    wal: LocalWAL, newest: ImmutableMessage | None
) -> list[dict[str, Any]] | None:
    """Every durable subscription with its lag behind ``newest``; None if the backend
    keeps none."""
    try:
        store = wal.backend.subscriptions()
    except InvalidArgument:
        return None
    found = []
    for name, stored in (await store.listed())[0]:
        checkpoint = stored.checkpoint
        scope = None if stored.scope is None else stored.scope.description
        entry = _subscription(name, checkpoint.marshal(), checkpoint.timetick, scope, newest)
        entry["records_behind"] = await _records_behind(wal, checkpoint.timetick, newest)
        found.append(entry)
    return found


def _node_subscriptions(
    status: NodeStatus, pchannel: str, newest: ImmutableMessage | None
) -> list[dict[str, Any]] | None:
    """The durable subscriptions the node reports for ``pchannel``, each with its lag
    behind ``newest`` (in records: unknown over the wire) and how many of the node's
    scanners read it; None if it reports none (it keeps no subscriptions)."""
    served = next((p for p in status.pchannels if p.pchannel == pchannel), None)
    if served is None or served.subscriptions is None:
        return None
    return [
        _subscription(s.name, s.checkpoint, s.timetick, s.scope, newest) | {"readers": s.readers}
        for s in served.subscriptions
    ]


def _subscription(
    name: str, checkpoint: str, tick: int, scope: str | None, newest: ImmutableMessage | None
) -> dict[str, Any]:
    """A subscription's entry: its checkpoint (marshalled) at timetick ``tick``, its
    scope, and how far it is behind ``newest`` in ticks and wall-clock milliseconds
    (``records_behind`` None: the caller fills it where it can count)."""
    ticks = 0 if newest is None else max(newest.timetick - tick, 0)
    return {
        "name": name,
        "checkpoint": checkpoint,
        "timetick": tick,
        "time": tick_time(tick) if tick else None,
        "scope": scope,
        "ticks_behind": ticks,
        "ms_behind": physical_ms(tick + ticks) - physical_ms(tick) if ticks else 0,
        "records_behind": None,
    }


async def _records_behind(wal: LocalWAL, tick: int, newest: ImmutableMessage | None) -> int | None:
    """How many records lie after the checkpoint at timetick ``tick`` up to ``newest``:
    every record, of every vchannel; None where ids are not sequence numbers."""
    if newest is None or newest.timetick <= tick:
        return 0
    end = newest.message_id
    if not isinstance(end, SequenceMessageId):
        return None
    after = tick + 1
    try:
        deliver = await wal.backend.start_at_timetick(after)
        async with wal.read(deliver, [Filter(min_timetick=after)], raw=True) as scanner:
            first = await anext(scanner)  # exists: ``newest`` has a greater tick
    except WALTruncated:
        return None  # the checkpoint's records were truncated away
    if not isinstance(first.message_id, SequenceMessageId):
        return None
    return end.seq - first.message_id.seq + 1


async def _routing(url: str, options: dict[str, Any]) -> dict[str, Any] | str | None:
    """The newest routing version stored with the log: a dict, None when there is
    none, or "unknown" when it cannot be read, or is not looked up: on pulsar://,
    where looking a topic up may create it."""
    if url.startswith("pulsar://"):
        return _UNKNOWN
    try:
        meta = await open_wal(url, ROUTING_PCHANNEL, read_only=True, **options)
    except InvalidArgument:
        return None  # no such pchannel
    except WALError:
        return _UNKNOWN
    async with meta:
        try:
            history = await load_routings(meta)
        except WALError:
            return _UNKNOWN
    if not history:
        return None
    routing = history[-1]
    return {
        "version": routing.version,
        "pchannels": list(routing.pchannels),
        "hash": routing.hash,
        "pins": len(routing.pins),
    }


def _node(status: NodeStatus, pchannel: str) -> dict[str, Any]:
    served = next((p for p in status.pchannels if p.pchannel == pchannel), None)
    streams = sum(1 for c in status.connections for s in c.streams if s.pchannel == pchannel)
    return {
        "version": status.version,
        "listen": status.listen,
        "url": status.url,
        "uptime": status.uptime,
        "draining": status.draining,
        "pchannel": None
        if served is None
        else {
            "term": served.term,
            "last_timetick": served.last_timetick,
            "latest_id": served.latest_message_id,
            "handles": served.handles,
            "streams": streams,
        },
    }


# ---------------------------------------------------------------------------------------
# The readable form


def _shown(record: dict[str, Any] | None) -> str:
    if record is None:
        return "-"
    return (
        f"{record['id']}  tick {record['timetick']}  {record['time']}  {record['type']}"
        f"  term {record['term']}"
    )


def _ms(ms: int) -> str:
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_report(report: dict[str, Any]) -> str:
    """``report`` as ``walsvc inspect`` prints it."""
    count = report["records"]
    held = "unknown number of" if count is None else f"{count:,}"
    lines = [
        f"pchannel   {report['pchannel']} at {report['url']}",
        f"records    {held} retained; latest id {report['latest_id'] or '-'}",
        f"first      {_shown(report['first'])}",
        f"newest     {_shown(report['newest'])}",
    ]
    writer = report["writer"]
    parts = [f"newest record written in term {writer['newest_record_term'] or '-'}"]
    if "head_term" in writer:
        by = f", opened by {writer['opened_by']}" if writer.get("opened_by") else ""
        parts.insert(0, f"term {writer['head_term']} (head file{by})")
    if "node_term" in writer:
        parts.insert(0, f"term {writer['node_term']} (the node's writer)")
    lines.append(f"writer     {'; '.join(parts)}")
    node = report.get("node")
    if node is not None:
        lines.append(
            f"node       {node['listen']}: walsvc {node['version']}, serving {node['url']},"
            f" up {node['uptime']:.0f} s{', DRAINING' if node['draining'] else ''}"
        )
        served = node["pchannel"]
        lines.append(
            "           not serving this pchannel"
            if served is None
            else f"           this pchannel: term {served['term']}, last timetick"
            f" {served['last_timetick']}, latest id {served['latest_id'] or '-'},"
            f" {served['handles']} handles, {served['streams']} streams"
        )
    file = report["file"]
    if file is not None:
        lines.append(
            f"segments   {len(file['segments'])} file{'' if len(file['segments']) == 1 else 's'},"
            f" {format_size(file['bytes'])} in"
            f" {file['path']}; durable end {file['durable_end']}, first retained"
            f" {file['first_seq']}"
        )
        lines += format_table(
            ("FIRST SEQ", "BYTES", "FILE"),
            [(s["first_seq"], format_size(s["bytes"]), s["path"]) for s in file["segments"]],
        )
    elif node is not None:
        lines.append(f"segments   {_UNKNOWN} (the node does not report them)")
    lines.append("open transactions")
    lines += format_table(
        ("TXN", "VCHANNEL", "BEGIN ID", "BEGUN", "BODIES", "BYTES", "TERM"),
        [
            (
                t["txn_id"],
                t["vchannel"] or "(broadcast)",
                t["begin_id"],
                t["begin_time"],
                t["bodies"],
                format_size(t["body_bytes"]),
                t["term"],
            )
            for t in report["open_transactions"]
        ],
    )
    subscriptions = report["subscriptions"]
    if subscriptions is None:
        why = (
            "the node does not report them for this pchannel"
            if node is not None
            else "none kept by this backend"
        )
        lines.append(f"subscriptions  {_UNKNOWN if node is not None else 'none'} ({why})")
    else:
        lines.append("subscriptions")
        lines += format_table(
            ("NAME", "CHECKPOINT", "SCOPE", "BEHIND", "TICKS BEHIND", "RECORDS BEHIND"),
            [
                (
                    s["name"],
                    s["checkpoint"],
                    s["scope"] or "-",
                    _ms(s["ms_behind"]),
                    s["ticks_behind"],
                    _UNKNOWN if s["records_behind"] is None else s["records_behind"],
                )
                for s in subscriptions
            ],
        )
    routing = report["routing"]
    if routing is None:
        lines.append(f"routing    none (no routing stored in {ROUTING_PCHANNEL})")
    elif routing == _UNKNOWN and (report if node is None else node)["url"].startswith("pulsar://"):
        lines.append(
            f"routing    {_UNKNOWN} (not looked up: a lookup of {ROUTING_PCHANNEL} may create"
            " its topic)"
        )
    elif routing == _UNKNOWN:
        lines.append(f"routing    {_UNKNOWN} ({ROUTING_PCHANNEL} could not be read)")
    else:
        lines.append(
            f"routing    version {routing['version']}: {len(routing['pchannels'])} pchannels,"
            f" hash {routing['hash']}, {routing['pins']} pins"
        )
    return "\n".join(lines)
