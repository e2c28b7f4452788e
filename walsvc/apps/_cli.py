"""The ``walsvc`` command line (also ``python -m walsvc``).

``walsvc demo`` is the project's main job, the one ``make run`` runs: concurrent producers
append to one pchannel, one vchannel is read back through a filter, the log is reopened
read-only, and every acknowledged message is checked to be there, intact and in order.
It prints one short line per step, with throughput and ack latency.

Exit status: 0 when everything verified, 1 when a check failed, 2 for bad usage or a
``walsvc.WALError`` (printed as ``error: <message>``, without a traceback), 130 on Ctrl-C.

``walsvc flush`` runs the flush job WAL -> Parquet on Spark (see ``_flush_command``);
``walsvc check`` verifies and repairs a local log (see ``_check_command``); ``walsvc
serve`` runs a node and ``walsvc status`` shows what one does (``_serve_command``,
``_status_command``); ``walsvc tail`` prints a pchannel's messages and follows it, and
``walsvc inspect`` reports what a pchannel holds (``_tail_command``,
``_inspect_command``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import platform
import shutil
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALError, WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, SequenceMessageId
from walsvc.core._message import ImmutableMessage, Message
from walsvc.wal._api import WAL
from walsvc.wal._open import open_wal

from ._check_command import add_check_parser, run_check_command
from ._cli_args import UsageError, event_loop, int_at_least
from ._flush_command import add_flush_parser, run_flush_command
from ._inspect_command import add_inspect_parser, run_inspect_command
from ._serve_command import add_serve_parser, run_serve_command
from ._status_command import add_status_parser, run_status_command
from ._tail_command import add_tail_parser, run_tail_command

__all__ = ("main",)

#: Start of every demo payload: writer term, producer number, the producer's sequence
#: number. A message read back thus says which run and producer wrote it, and where it
#: belongs in that producer's order.
_PAYLOAD_HEADER: Final = struct.Struct(">QII")
#: How long a read may wait for the next batch before the demo calls the log incomplete.
#: Scanners tail the log forever, so a missing message would otherwise be a hang.
_STALL_S: Final = 10.0
#: memory:// acknowledges without suspending; producers yield this often so that the
#: other producers and the progress bar get to run.
_YIELD_EVERY: Final = 256
_PROGRESS_INTERVAL_S: Final = 0.1
_LABEL_WIDTH: Final = 6
_TIMING_WIDTH: Final = 8


class _Failed(Exception):
    """A verification failed: the log lost, changed or reordered what was acknowledged."""


@final
@dataclass(frozen=True, slots=True)
class _DemoOptions:
    url: str
    pchannel: str
    messages: int
    producers: int
    vchannels: int
    payload_size: int
    sync: str
    fresh: bool
    progress: bool

    @property
    def scheme(self) -> str:
        return self.url.partition("://")[0]

    @property
    def backend_options(self) -> dict[str, Any]:
        # Only the file backend takes ``sync``; memory:// rejects every option.
        return {"sync": self.sync} if self.scheme == "file" else {}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``walsvc`` command line on ``argv`` (default: ``sys.argv[1:]``) and return
    the process exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.command == "flush":
        return run_flush_command(args)
    if args.command == "check":
        return run_check_command(args)
    if args.command == "serve":
        return run_serve_command(args)
    if args.command == "status":
        return run_status_command(args)
    if args.command == "tail":
        return run_tail_command(args)
    if args.command == "inspect":
        return run_inspect_command(args)
    options = _DemoOptions(
        url=args.url,
        pchannel=args.pchannel,
        messages=args.messages,
        producers=args.producers,
        vchannels=args.vchannels,
        payload_size=args.payload_size,
        sync=args.sync,
        fresh=args.fresh,
        progress=args.progress,
    )
    loop_factory, loop_name = event_loop()
    try:
        if options.fresh:
            _delete_file_log(options.url)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_demo(options, loop_name))
    except (WALError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="walsvc", description="walsvc write-ahead log tools")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="append from concurrent producers, read back, reopen, verify",
        description=(
            "Append messages from concurrent producers across several vchannels, read one"
            " vchannel back through a filter, reopen the log read-only and verify that"
            " every acknowledged message is there, intact and in order. Prints throughput"
            " and ack latency. Appends to what the log already holds unless --fresh."
        ),
    )
    demo.add_argument("--url", default="file://walsvc-data", help="WAL URL (%(default)s)")
    demo.add_argument("--pchannel", default="demo-0", help="pchannel to use (%(default)s)")
    demo.add_argument(
        "--messages", type=int_at_least(1), default=200_000, help="total (%(default)s)"
    )
    demo.add_argument(
        "--producers",
        type=int_at_least(1),
        default=64,
        help="concurrent producer tasks, each awaiting its own acks (%(default)s)",
    )
    demo.add_argument(
        "--vchannels", type=int_at_least(1), default=16, help="vchannels (%(default)s)"
    )
    demo.add_argument(
        "--payload-size",
        type=int_at_least(_PAYLOAD_HEADER.size),
        default=100,
        help="payload bytes per message (%(default)s)",
    )
    demo.add_argument(
        "--sync",
        choices=("always", "none"),
        default="always",
        help="file:// only: fdatasync before each ack, or never: not crash-safe (%(default)s)",
    )
    demo.add_argument(
        "--fresh",
        action="store_true",
        help="delete the file:// data directory first (default: append to what is there)",
    )
    demo.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )
    add_flush_parser(commands)
    add_check_parser(commands)
    add_serve_parser(commands)
    add_status_parser(commands)
    add_tail_parser(commands)
    add_inspect_parser(commands)
    return parser


def _delete_file_log(url: str) -> None:
    """Delete the directory of a file:// log, refusing anything that is not one."""
    scheme, _, location = url.partition("://")
    if scheme != "file":
        raise UsageError(f"--fresh deletes a file:// log's directory; it cannot clear {url}")
    root = Path(location).expanduser()  # as the file backend reads it
    try:
        if not root.exists():
            return
        if not root.is_dir():
            raise UsageError(f"--fresh: {root} is not a directory; not deleting it")
        # A file:// log is a directory of pchannel directories, each with a head file.
        strays = sorted(c.name for c in root.iterdir() if not (c / "head").is_file())
        if strays:
            raise UsageError(
                f"--fresh: {root} holds {strays[0]!r}, which is not a walsvc pchannel;"
                " not deleting it"
            )
        shutil.rmtree(root)
    except OSError as exc:
        raise UsageError(f"--fresh: cannot delete {root}: {exc}") from exc


# ---------------------------------------------------------------------------------------
# What the producers write, and checking what comes back


@final
class _Workload:
    """Producer p appends its messages 0, 1, ... in order; message i goes to vchannel
    (p + i) mod V, carries the property ``producer=p``, and its payload is
    (term, p, i) followed by fixed padding, so every message read back can be checked
    exactly without keeping what was written."""

    __slots__ = ("counts", "padding", "payload_size", "properties", "term", "vchannel_names")

    def __init__(self, options: _DemoOptions, term: int) -> None:
        share, extra = divmod(options.messages, options.producers)
        self.counts = [share + (p < extra) for p in range(options.producers)]
        self.term = term
        self.payload_size = options.payload_size
        filler = b"walsvc-demo "
        pad_size = options.payload_size - _PAYLOAD_HEADER.size
        self.padding = (filler * (pad_size // len(filler) + 1))[:pad_size]
        self.vchannel_names = [f"vchannel-{v}" for v in range(options.vchannels)]
        # One mapping per producer, shared by its messages (they never change it).
        self.properties = [{"producer": str(p)} for p in range(options.producers)]

    def vchannel(self, producer: int, seq: int) -> str:
        return self.vchannel_names[(producer + seq) % len(self.vchannel_names)]

    def message(self, producer: int, seq: int) -> Message:
        return Message(
            payload=_PAYLOAD_HEADER.pack(self.term, producer, seq) + self.padding,
            vchannel=self.vchannel(producer, seq),
            properties=self.properties[producer],
        )

    def sequence(self, producer: int, vchannel: int | None) -> range:
        """The sequence numbers of ``producer``'s messages to ``vchannel`` (None: all)."""
        if vchannel is None:
            return range(self.counts[producer])
        vchannels = len(self.vchannel_names)
        return range((vchannel - producer) % vchannels, self.counts[producer], vchannels)


@final
class _Checker:
    """Checks messages read back, in log order, against what was written and acked: each
    producer's messages arrive in its order, none missing, none extra, each with the
    payload, vchannel, properties, term and id it was written and acknowledged with."""

    __slots__ = ("_acked", "_ends", "_last_id", "_next", "_step", "_workload", "count", "total")

    def __init__(
        self, workload: _Workload, acked: list[list[MessageId]], vchannel: int | None
    ) -> None:
        self._workload = workload
        self._acked = acked
        sequences = [workload.sequence(p, vchannel) for p in range(len(acked))]
        self._next = [s.start for s in sequences]
        self._ends = [s.start + len(s) * s.step for s in sequences]
        self._step = sequences[0].step
        self._last_id: MessageId | None = None
        #: How many messages this checker expects, and how many it has seen.
        self.total = sum(map(len, sequences))
        self.count = 0

    def check(self, batch: Sequence[ImmutableMessage]) -> None:
        workload, acked, next_seq, ends = self._workload, self._acked, self._next, self._ends
        names, size, padding = workload.vchannel_names, workload.payload_size, workload.padding
        vchannels, step, term = len(names), self._step, workload.term
        last_id = self._last_id
        count = 0
        for message in batch:
            if message.type.is_system:
                continue  # the WAL's own timeticks
            payload = message.payload
            if len(payload) != size or not payload.endswith(padding):
                raise _Failed(f"{_at(message)}: the payload is not one this demo wrote")
            written_in, producer, seq = _PAYLOAD_HEADER.unpack_from(payload)
            if written_in != term or message.term != term:
                raise _Failed(f"{_at(message)}: written in term {message.term}, not {term}")
            if producer >= len(next_seq):
                raise _Failed(f"{_at(message)}: there is no producer {producer}")
            due = next_seq[producer]
            if seq != due:
                raise _Failed(
                    f"{_at(message)}: producer {producer}'s message {due} is missing"
                    f" (this is its {seq})"
                    if seq > due
                    else f"{_at(message)}: producer {producer}'s message {seq} again"
                    f" (expected {due})"
                )
            if seq >= ends[producer]:
                raise _Failed(f"{_at(message)}: producer {producer} never sent message {seq}")
            if message.vchannel != names[(producer + seq) % vchannels]:
                raise _Failed(f"{_at(message)}: in the wrong vchannel {message.vchannel!r}")
            if message.properties != workload.properties[producer]:
                raise _Failed(f"{_at(message)}: properties {dict(message.properties)} changed")
            message_id = message.message_id
            if message_id != acked[producer][seq]:
                ack = acked[producer][seq].marshal()
                raise _Failed(f"{_at(message)}: producer {producer}'s {seq} was acked as {ack}")
            if last_id is not None and not last_id < message_id:
                raise _Failed(f"{_at(message)}: ids do not increase (after {last_id.marshal()})")
            next_seq[producer] = seq + step
            last_id = message_id
            count += 1
        self._last_id = last_id
        self.count += count

    def finish(self) -> None:
        for producer, (seq, end) in enumerate(zip(self._next, self._ends, strict=True)):
            if seq < end:
                raise _Failed(
                    f"producer {producer}'s message {seq} was acknowledged but is missing"
                    f" ({self.count:,} of {self.total:,} read)"
                )


def _ms(milliseconds: float) -> str:
    return f"{milliseconds:.2f} ms" if milliseconds >= 0.1 else f"{milliseconds * 1e3:.0f} us"


def _at(message: ImmutableMessage) -> str:
    return f"message {message.message_id.marshal()}"


# ---------------------------------------------------------------------------------------
# The demo


@final
class _Report:
    """The demo's output: one aligned line per step on stdout."""

    __slots__ = ()

    def line(self, label: str, text: str, seconds: float | None = None) -> None:
        timing = "" if seconds is None else f"{seconds:.2f} s"
        print(f"{label:<{_LABEL_WIDTH}}{timing:>{_TIMING_WIDTH}}  {text}".rstrip(), flush=True)


@final
class _Progress:
    """A tqdm bar on stderr that polls a counter, so producers pay nothing per message.
    There is none when disabled, when stderr is not a terminal or tqdm is not installed."""

    __slots__ = ("_bar",)

    def __init__(self, total: int, enabled: bool, desc: str = "append") -> None:
        self._bar: Any = None
        stream = sys.stderr
        if not enabled or stream is None or not stream.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(
            total=total, desc=desc, unit=" msgs", unit_scale=True, leave=False, file=stream
        )

    async def follow(self, count: Callable[[], int]) -> None:
        bar = self._bar
        if bar is None:
            return
        while True:
            await asyncio.sleep(_PROGRESS_INTERVAL_S)
            bar.update(count() - bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@final
@dataclass(slots=True)
class _Appended:
    acked: list[list[MessageId]]  # per producer, by sequence number
    latencies: list[float]  # seconds, sorted
    seconds: float

    @property
    def last_id(self) -> MessageId:
        """The newest id acknowledged."""
        return max(ids[-1] for ids in self.acked if ids)

    def last_id_of(self, workload: _Workload, vchannel: int) -> MessageId:
        """The newest id acknowledged for a message to ``vchannel``."""
        last = (workload.sequence(p, vchannel)[-1:] for p in range(len(self.acked)))
        return max(self.acked[p][seq] for p, seqs in enumerate(last) for seq in seqs)

    def latency_ms(self, quantile: float) -> float:
        """Nearest-rank quantile of the ack latencies, in milliseconds."""
        rank = max(1, math.ceil(quantile * len(self.latencies)))
        return self.latencies[rank - 1] * 1e3


async def _demo(options: _DemoOptions, loop_name: str) -> int:
    started = time.perf_counter()
    report = _Report()
    print(f"walsvc demo: {loop_name} event loop, Python {platform.python_version()}", flush=True)
    try:
        await _run(options, report, started)
    except _Failed as failure:
        print(f"FAILED: {failure}", flush=True)
        return 1
    return 0


async def _run(options: _DemoOptions, report: _Report, started: float) -> None:
    clock = time.perf_counter
    t = clock()
    wal = await open_wal(options.url, options.pchannel, **options.backend_options)
    async with wal:
        await wal.wait_ready()  # the opening TimeTick is in the log
        before = await wal.latest_message_id()
        existing = await _count_messages(wal, before)
        held = "?" if existing is None else f"{existing:,}"
        report.line(
            "open",
            f"{options.url}, pchannel {wal.pchannel}, term {wal.term}: {held} records in the log",
            clock() - t,
        )

        workload = _Workload(options, wal.term)
        appended = await _append(wal, workload, options.progress)
        sync = f", sync={options.sync}" if "sync" in options.backend_options else ""
        report.line(
            "append",
            f"{options.messages:,} msgs x {options.payload_size} B, {options.producers}"
            f" producers, {options.vchannels} vchannels{sync}",
            appended.seconds,
        )
        rate = options.messages / appended.seconds
        report.line(
            "",
            f"{rate:,.0f} msgs/s  {rate * options.payload_size / 1e6:,.1f} MB/s"
            f"  ack latency p50 {_ms(appended.latency_ms(0.50))}"
            f"  p99 {_ms(appended.latency_ms(0.99))}",
        )

        t = clock()
        vchannel = 0
        name = workload.vchannel_names[vchannel]
        checker = _Checker(workload, appended.acked, vchannel)
        stop_at = appended.last_id_of(workload, vchannel)
        await _scan(wal, before, Filter(vchannels=[name]), checker, stop_at, options.progress)
        checker.finish()
        seconds = clock() - t
        report.line(
            "read",
            f"filter {name}: {checker.count:,} msgs, all in order;"
            f" {options.messages / seconds:,.0f} records/s",
            seconds,
        )

        t = clock()
        await wal.aclose()
        report.line("close", "", clock() - t)

    t = clock()
    last_id = appended.last_id
    async with await open_wal(
        options.url, options.pchannel, read_only=True, **options.backend_options
    ) as reopened:
        latest = await reopened.latest_message_id()
        if latest is None or latest < last_id:
            shown = "none" if latest is None else latest.marshal()
            raise _Failed(f"after reopening, the latest id is {shown}, before the last ack")
        total = await _count_messages(reopened, latest)
        checker = _Checker(workload, appended.acked, None)
        await _scan(reopened, before, None, checker, last_id, options.progress, "verify")
        checker.finish()
    report.line(
        "reopen",
        f"read-only: {checker.count:,} msgs intact, last ack {last_id.marshal()}",
        clock() - t,
    )
    held = "" if total is None else f", the log holds {total:,} records"
    print(
        f"OK: {options.messages:,} msgs acked, read back and verified after reopen"
        f" ({clock() - started:.1f} s{held})",
        flush=True,
    )


async def _count_messages(wal: WAL, latest: MessageId | None) -> int | None:
    """How many messages the log holds, or None if its ids do not say."""
    if latest is None:
        return 0
    if not isinstance(latest, SequenceMessageId):
        return None
    # Sequence ids are dense: the count is the distance from the first retained message.
    # Reading ``latest`` first tells a log truncated to nothing (WALTruncated) from one
    # that still holds messages: in the first, a read from the start would wait forever.
    try:
        async with asyncio.timeout(_STALL_S):
            async with wal.read(DeliverPolicy.start_from(latest), raw=True) as scanner:
                await anext(scanner)
            async with wal.read(DeliverPolicy.all(), raw=True) as scanner:
                first = (await anext(scanner)).message_id
    except WALTruncated:
        return 0
    except TimeoutError:
        return None
    if not isinstance(first, SequenceMessageId):
        return None
    return latest.seq - first.seq + 1


async def _append(wal: WAL, workload: _Workload, progress: bool) -> _Appended:
    """Every producer appends its messages one at a time, awaiting each ack."""
    clock = time.perf_counter
    acked: list[list[MessageId]] = [[] for _ in workload.counts]
    latencies: list[list[float]] = [[] for _ in workload.counts]

    async def produce(producer: int) -> None:
        ids, times = acked[producer], latencies[producer]
        message, append = workload.message, wal.append
        for seq in range(workload.counts[producer]):
            msg = message(producer, seq)
            t0 = clock()
            result = await append(msg)
            times.append(clock() - t0)
            ids.append(result.message_id)
            if seq % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)

    bar = _Progress(sum(workload.counts), progress)
    t0 = clock()
    producers = [asyncio.create_task(produce(p)) for p in range(len(workload.counts))]
    ticker = asyncio.create_task(bar.follow(lambda: sum(map(len, acked))))
    try:
        await asyncio.gather(*producers)
        seconds = clock() - t0
    finally:
        # On failure, stop the other producers too; gather already marked their errors
        # retrieved. asyncio.wait never raises, so our own cancellation still propagates.
        for task in (*producers, ticker):
            task.cancel()
        await asyncio.wait((*producers, ticker))
        bar.close()
    return _Appended(acked, sorted(itertools.chain.from_iterable(latencies)), seconds)


async def _scan(
    wal: WAL,
    before: MessageId | None,
    only: Filter | None,
    checker: _Checker,
    stop_at: MessageId,
    progress: bool,
    desc: str = "read",
) -> None:
    """Check what ``wal`` holds after ``before`` up to ``stop_at`` (the last id written),
    with a progress bar of the messages checked (on a terminal, as for the appends)."""
    deliver = DeliverPolicy.all() if before is None else DeliverPolicy.start_after(before)
    loop = asyncio.get_running_loop()
    bar = _Progress(checker.total, progress, desc)
    ticker = asyncio.create_task(bar.follow(lambda: checker.count))
    try:
        async with (
            wal.read(deliver, () if only is None else [only]) as scanner,
            asyncio.timeout(_STALL_S) as deadline,
        ):
            async for batch in scanner.batches():
                checker.check(batch)
                if not batch[-1].message_id < stop_at:
                    break
                deadline.reschedule(loop.time() + _STALL_S)
    except TimeoutError:
        raise _Failed(
            f"reading stalled for {_STALL_S:.0f} s after {checker.count:,} of"
            f" {checker.total:,} messages: the rest is missing"
        ) from None
    finally:
        ticker.cancel()
        await asyncio.wait((ticker,))
        bar.close()
