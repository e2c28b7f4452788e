"""``walsvc status walsvc://HOST:PORT``: what a running node is doing.

Prints the node (version, the log it serves, uptime, whether it drains), its pchannels
(term, last timetick, latest id, handles), its connections (peer, age, handles,
requests in flight, bytes queued for the client) and their streams (filter, messages
delivered, credit left, whether the node waits for the reader's credit: pressure), as
tables; ``--json`` prints the same as one JSON object (the ``NodeStatus`` fields). The
token comes from ``--token-file`` or ``WALSVC_TOKEN``, as for ``walsvc serve``;
``--tls-ca`` (and ``--tls-cert``/``--tls-key`` for a client certificate) speak TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from walsvc.core._errors import BackendUnavailable, WALError
from walsvc.remote._node_status import NodeLimits, NodeStatus
from walsvc.remote._status import fetch_status

from ._cli_args import UsageError, add_node_options, bearer_token, event_loop, tls_context

__all__ = (
    "add_status_parser",
    "format_size",
    "format_status",
    "format_table",
    "run_status_command",
)


def add_status_parser(commands: Any) -> None:
    """Add ``walsvc status`` to the command line's subparsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "status",
        help="show what a walsvc node is doing",
        description=(
            "Show a walsvc node's pchannels, connections and streams (credit, pressure)."
            " The token comes from --token-file, else WALSVC_TOKEN."
        ),
    )
    parser.add_argument("url", help="the node, walsvc://host:port")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_node_options(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the node's answer (%(default)s)",
    )


async def _fetch(
    url: str, token: str | None, tls: ssl.SSLContext | None, seconds: float
) -> NodeStatus:
    try:
        async with asyncio.timeout(seconds):
            return await fetch_status(url, token=token, tls=tls, connect_timeout=seconds)
    except TimeoutError:
        raise BackendUnavailable(f"the node at {url} did not answer within {seconds} s") from None


def run_status_command(args: argparse.Namespace) -> int:
    """Run ``walsvc status``; return the exit status (2 if the node cannot be asked)."""
    loop_factory, _ = event_loop()
    try:
        token, tls = bearer_token(args.token_file), tls_context(args)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            status = runner.run(_fetch(args.url, token, tls, args.timeout))
    except (WALError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a node that does not answer, within --timeout
        print("interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        print(format_status(status))
    return 0


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """``rows`` under ``header`` as aligned, indented lines ("(none)" without rows)."""
    if not rows:
        return ["  (none)"]
    cells = [list(header), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def format_size(count: int) -> str:
    """``count`` bytes, in B, KiB, MiB or GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(count) >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} B"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def _limits(limits: NodeLimits) -> str:
    idle = "never" if limits.idle_timeout is None else f"{limits.idle_timeout:g} s"
    return (
        f"queue {format_size(limits.send_queue_bytes)} per peer, stall {limits.stall_timeout:g} s,"
        f" in flight {limits.max_in_flight} / {format_size(limits.max_in_flight_bytes)},"
        f" frame {limits.frame_timeout:g} s, idle {idle},"
        f" handshake {limits.handshake_timeout:g} s"
    )


def format_status(status: NodeStatus) -> str:
    """``status`` as the tables ``walsvc status`` prints."""
    started = datetime.datetime.fromtimestamp(status.started_at, datetime.UTC)
    lines = [
        f"node     {status.listen}: walsvc {status.version},"
        f" protocol {status.min_version}..{status.max_version}",
        f"serving  {status.url}",
        f"up       {_duration(status.uptime)} (since {started:%Y-%m-%d %H:%M:%S} UTC);"
        f" {'DRAINING' if status.draining else 'not draining'};"
        f" {status.refused_peers} peers refused",
        f"limits   {_limits(status.limits)}",
        "",
        "pchannels",
    ]
    lines += format_table(
        ("PCHANNEL", "TERM", "LAST TIMETICK", "LATEST ID", "HANDLES"),
        [
            (p.pchannel, p.term, p.last_timetick, p.latest_message_id or "-", p.handles)
            for p in status.pchannels
        ],
    )
    now = status.started_at + status.uptime
    lines += ["", "connections"]
    lines += format_table(
        (
            "CONN",
            "PEER",
            "VERSION",
            "CONNECTED",
            "HANDLES",
            "IN FLIGHT",
            "QUEUED",
            "READING",
            "STREAMS",
        ),
        [
            (
                c.connection,
                c.peer,
                c.version,
                f"{_duration(now - c.connected_at)} ago",
                ",".join(f"{h.pchannel}{' (ro)' if h.read_only else ''}" for h in c.handles) or "-",
                c.in_flight,
                format_size(c.queued_bytes),
                "paused" if c.reading_paused else "yes",
                len(c.streams),
            )
            for c in status.connections
        ],
    )
    if status.omitted_connections:
        lines.append(
            f"... and {status.omitted_connections} more connections, not shown:"
            " a status answer holds what fits in one frame"
        )
    lines += ["", "streams"]
    lines += format_table(
        ("CONN", "STREAM", "PCHANNEL", "DELIVER", "FILTER", "DELIVERED", "CREDIT", "WAITING"),
        [
            (
                c.connection,
                s.stream,
                s.pchannel,
                s.deliver,
                s.filter,
                s.delivered,
                f"{s.credit_messages} msgs / {format_size(s.credit_bytes)}",
                "credit" if s.waiting_for_credit else "send" if s.waiting_for_send else "-",
            )
            for c in status.connections
            for s in c.streams
        ],
    )
    return "\n".join(lines)
