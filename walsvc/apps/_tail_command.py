"""``walsvc tail URL PCHANNEL``: print a pchannel's messages, and follow new ones.

The log is opened read-only (nothing is fenced, nothing written; over ``walsvc://`` a
read-only handle on the node). Where it starts: ``--from ID`` (inclusive; the id as walsvc
prints it, ``file:12``), ``--latest`` (only messages appended from now on), else the
earliest message the log retains. ``--vchannel`` (repeatable) and ``--type`` (repeatable:
a name such as ``INSERT``, or a number) become one ``walsvc.Filter``, which the backend
applies to record headers: dropped messages are never decoded. Broadcast messages
(vchannel "") pass every vchannel filter; transactions arrive once committed, as one TXN
message holding their bodies; the WAL's TimeTicks and transaction control records are
left out unless ``--system`` (the log exactly as stored: ``WAL.read(raw=True)``).

Output, one message per line: id, timetick, its wall-clock time (UTC), vchannel, type,
payload size and a short preview (text in quotes, else the first bytes in hex); a
transaction's bodies follow it, indented. ``--json`` prints one JSON object per message
(JSON Lines, the payload in base64); ``--raw`` writes each payload's bytes as stored,
followed by a newline, and nothing else (a transaction: its bodies' payloads).

It follows the log until Ctrl-C (exit status 130, no traceback), ``--count N`` messages
were printed, ``--timeout S`` seconds passed without one, or, with ``--no-follow``, it
has read as far as the newest message of the log when it started. A closed pipe
(``walsvc tail ... | head``) ends it quietly (exit status 0). Exit status 2: bad usage,
or a log that cannot be opened or read (``error: <message>``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

from walsvc.core._api import Scanner
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALError
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, unmarshal_message_id
from walsvc.core._message import ImmutableMessage, MessageType
from walsvc.core._timetick import physical_ms
from walsvc.remote._open import open_wal

from ._cli_args import UsageError, add_node_options, event_loop, int_at_least, node_options
from ._cli_args import seconds as positive_seconds

__all__ = ("add_tail_parser", "message_line", "parse_type", "run_tail_command")

#: How often ``--no-follow`` asks the scanner how far it read while it waits: the last
#: records of the log may all be ones its filter drops.
_POLL_S: Final = 0.05
#: ``--no-follow``: a reader that neither delivers nor moves this long is at the end
#: (``--timeout`` sets another spell, counted in messages delivered).
_NO_POSITION_QUIET_S: Final = 2.0
#: Characters of payload text, and bytes of a binary payload, a line shows.
_PREVIEW_CHARS: Final = 40
_PREVIEW_BYTES: Final = 16


def add_tail_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``walsvc tail`` to the command line's subparsers."""
    tail = commands.add_parser(
        "tail",
        help="print a pchannel's messages and follow new ones",
        description=(
            "Print the messages of one pchannel, one line each, from the earliest the log"
            " retains (or --from ID, or --latest), then follow new ones until Ctrl-C."
            " Opens the log read-only. Filters are applied by the backend to record"
            " headers, so dropped messages cost no payload decoding."
        ),
    )
    tail.add_argument("url", help="file:///path, kafka://host:port, pulsar://..., walsvc://...")
    tail.add_argument("pchannel")
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="start",
        metavar="ID",
        help="start at this message id, inclusive (as printed: file:12, pulsar:7:3:-1:-1)",
    )
    start.add_argument("--latest", action="store_true", help="only messages appended from now on")
    tail.add_argument(
        "--vchannel",
        action="append",
        default=[],
        metavar="V",
        help="only this vchannel (repeatable; broadcast messages always pass)",
    )
    tail.add_argument(
        "--type",
        dest="types",
        action="append",
        default=[],
        type=parse_type,
        metavar="T",
        help="only this message type, by name (INSERT) or number (repeatable)",
    )
    tail.add_argument(
        "--system",
        action="store_true",
        help="the log as stored: TimeTicks and transaction control records too",
    )
    output = tail.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object per line")
    output.add_argument(
        "--raw", action="store_true", help="each payload's bytes, then a newline; nothing else"
    )
    tail.add_argument("--count", type=int_at_least(1), metavar="N", help="stop after N messages")
    tail.add_argument(
        "--no-follow",
        action="store_true",
        help="stop at the newest message of the log as it was when tail started",
    )
    tail.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="S",
        help="stop when no message came for S seconds (exit status 0)",
    )
    add_node_options(tail)


def parse_type(text: str) -> MessageType:
    """An argparse type: a ``MessageType`` by name (any case) or number."""
    name = text.strip()
    try:
        if name.isascii() and name.isdigit():
            return MessageType(int(name))
        if name.upper().startswith("APPLICATION_"):
            return MessageType(int(name[len("APPLICATION_") :]))
        return MessageType[name.upper()]
    except (KeyError, ValueError):
        known = ", ".join(t.name for t in MessageType)
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a message type ({known}, or a number 10000-65535)"
        ) from None


def run_tail_command(args: argparse.Namespace) -> int:
    """Run ``walsvc tail``; return the exit status."""
    loop_factory, _ = event_loop()
    try:
        start = None if args.start is None else _parse_id(args.start)
        options = node_options(args.url, args)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_tail(args, start, options))
    except (WALError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _silence_stdout()
    return 0


def _parse_id(text: str) -> MessageId:
    try:
        return unmarshal_message_id(text)
    except WALError as exc:
        raise UsageError(f"--from: {exc}") from None


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null, so the interpreter's last flush at
    exit does not fail again and print a warning."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a real file (captured output)
        pass


async def _tail(args: argparse.Namespace, start: MessageId | None, options: dict[str, Any]) -> None:
    wal = await open_wal(args.url, args.pchannel, read_only=True, **options)
    async with wal:
        latest = await wal.latest_message_id()
        if start is not None and latest is not None and type(start) is not type(latest):
            raise UsageError(f"--from {args.start}: this log's ids look like {latest.marshal()}")
        end = latest if args.no_follow else None
        if args.no_follow and (latest is None or args.latest):
            return  # nothing is, or will be, between the start and the end
        if start is not None:
            deliver = DeliverPolicy.start_from(start)
        elif args.latest:
            deliver = DeliverPolicy.latest()
        else:
            deliver = DeliverPolicy.all()
        filters = (
            [Filter(vchannels=args.vchannel or None, types=args.types or None)]
            if args.vchannel or args.types
            else []
        )
        # --no-follow asks for ticks even without --system: a node's idle ticks say that
        # the scanner has read to the end when the last records are ones it drops.
        scanner = wal.read(
            deliver, filters, raw=args.system, timeticks=args.system or args.no_follow
        )
        printer = _Printer(args.json, args.raw, sys.stdout)
        async with scanner:
            await _follow(scanner, printer, args, end)


async def _follow(
    scanner: Scanner, printer: _Printer, args: argparse.Namespace, end: MessageId | None
) -> None:
    batches = scanner.batches()

    async def next_batch() -> Sequence[ImmutableMessage]:
        return await anext(batches)

    loop = asyncio.get_running_loop()
    count: int | None = args.count
    printed = 0
    # --no-follow stops once the reader is at or past the newest id. A reader that
    # does not report how far it read (pulsar://) may never get there when the filter
    # drops the last records: a quiet spell in which it neither delivered nor moved
    # ends --no-follow too.
    timeout: float | None = args.timeout
    quiet_rule = end is not None and timeout is None
    if quiet_rule:
        timeout = _NO_POSITION_QUIET_S
    quiet_until = None if timeout is None else loop.time() + timeout
    at_end = False
    seen: MessageId | None = None
    pending: asyncio.Task[Sequence[ImmutableMessage]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(next_batch())
            wait: float | None = None
            if end is not None:
                wait = _POLL_S
            if quiet_until is not None:
                left = max(0.0, quiet_until - loop.time())
                wait = left if wait is None else min(wait, left)
            done, _ = await asyncio.wait((pending,), timeout=wait)
            if not done:
                position = scanner.stats().position
                if end is not None and position is not None and not position < end:
                    # Past the end: once more, for a batch the reader had in hand.
                    if at_end:
                        return
                    at_end = True
                    continue
                if quiet_rule and timeout is not None and position != seen:
                    seen = position
                    quiet_until = loop.time() + timeout
                if quiet_until is not None and loop.time() >= quiet_until:
                    return
                continue
            batch = pending.result()
            pending = None
            at_end = False
            if quiet_until is not None and timeout is not None:
                quiet_until = loop.time() + timeout
            for message in batch:
                if end is not None and end < message.message_id:
                    return
                if _shown(message, args.system):
                    printer.show(message)
                    printed += 1
                    if count is not None and printed >= count:
                        return
                if end is not None and not message.message_id < end:
                    return
            printer.flush()
    finally:
        printer.flush()
        if pending is not None:
            pending.cancel()
            await asyncio.wait((pending,))
        await batches.aclose()


def _shown(message: ImmutableMessage, system: bool) -> bool:
    """Whether tail prints ``message``: not a node's idle tick, nor a TimeTick asked
    for only to see the reader move (without --system), nor a committed transaction
    none of whose messages passed the filter."""
    if not message.persisted:
        return False
    if system:
        return True
    kind = message.type
    if kind is MessageType.TIME_TICK:
        return False
    return kind is not MessageType.TXN or bool(message.body)


class _Printer:
    """Writes messages as lines of text, JSON Lines or raw payloads."""

    __slots__ = ("_json", "_out", "_raw")

    def __init__(self, as_json: bool, raw: bool, out: TextIO) -> None:
        self._json = as_json
        self._raw = raw
        self._out = out

    def show(self, message: ImmutableMessage) -> None:
        out = self._out
        if self._raw:
            binary = out.buffer
            out.flush()
            for one in message.body or (message,):
                binary.write(one.payload)
                binary.write(b"\n")
        elif self._json:
            out.write(json.dumps(message_json(message), ensure_ascii=False) + "\n")
        else:
            out.write(message_line(message) + "\n")
            for one in message.body:
                out.write("  " + message_line(one) + "\n")

    def flush(self) -> None:
        if self._raw:
            self._out.buffer.flush()
        self._out.flush()


def tick_time(timetick: int) -> str:
    """The wall-clock time of a hybrid timetick, UTC, to the millisecond."""
    try:
        when = datetime.datetime.fromtimestamp(physical_ms(timetick) / 1000, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "?"
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _vchannel(name: str) -> str:
    return name if name else "(broadcast)"


def preview(payload: bytes) -> str:
    """A short, one-line view of ``payload``: its text in quotes (escaped as JSON), or
    its first bytes in hex."""
    if not payload:
        return ""
    head = payload[: _PREVIEW_CHARS * 4]
    text: str | None
    try:
        text = head.decode()
    except UnicodeDecodeError as exc:
        # A character the cut above split in two is still text; anything else is binary.
        cut_char = len(head) < len(payload) and exc.start >= len(head) - 3
        text = head[: exc.start].decode() if cut_char else None
    if text is None or not text.isprintable():
        more = "..." if len(payload) > _PREVIEW_BYTES else ""
        return "0x" + payload[:_PREVIEW_BYTES].hex() + more
    shown = text[:_PREVIEW_CHARS]
    more = "..." if len(shown.encode()) < len(payload) else ""
    return json.dumps(shown, ensure_ascii=False) + more


def message_line(message: ImmutableMessage) -> str:
    """One message as ``walsvc tail`` prints it."""
    if message.body:
        size = sum(len(m.payload) for m in message.body)
        what = f"{len(message.body)} msgs, {size} B"
    else:
        what = f"{len(message.payload)} B"
        shown = preview(message.payload)
        if shown:
            what += "  " + shown
    txn = "" if message.txn is None else f"  txn {message.txn.txn_id}"
    return (
        f"{message.message_id.marshal()}  {message.timetick}  {tick_time(message.timetick)}"
        f"  {_vchannel(message.vchannel)}  {message.type.name}  {what}{txn}"
    )


def message_json(message: ImmutableMessage) -> dict[str, Any]:
    """One message as ``walsvc tail --json`` prints it."""
    lc = message.last_confirmed_id
    return {
        "id": message.message_id.marshal(),
        "timetick": message.timetick,
        "time": tick_time(message.timetick),
        "vchannel": message.vchannel,
        "type": message.type.name,
        "type_value": int(message.type),
        "size": len(message.payload),
        "payload_base64": base64.b64encode(message.payload).decode(),
        "properties": dict(message.properties),
        "term": message.term,
        "last_confirmed_id": None if lc is None else lc.marshal(),
        "txn": None if message.txn is None else message.txn.txn_id,
        "idempotency_key": message.idempotency_key,
        "body": [message_json(m) for m in message.body],
    }
