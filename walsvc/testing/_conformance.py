"""``check_backend``: the conformance battery every walsvc backend passes.

Adapted from Milvus's ``pkg/streaming/walimpls/test_framework.go`` and run through the
``walsvc.WAL`` users hold, so it checks the backend together with the layer above it.
Per pchannel, concurrently over several fresh pchannels:

1. Three terms. Each opens read-write, appends from concurrent producers (``append`` and
   ``append_many``) while two scanners tail from ``DeliverPolicy.all()`` until the term's
   final message; checks the reads against everything ever written; checks
   ``start_from``/``start_after`` seeks and that ``latest()`` waits for new messages;
   closes; reopens read-only, reads everything and is refused writes.
2. Fencing: a second read-write open fences the first writer.
3. Closing: scanners and calls on a closed WAL.
4. Truncation, durable across reopen, including truncating the whole log.
5. Exactly-once (``_exactly_once.py``): keyed appends, batches and transactions retried
   after cancellations and across a reopen land once; ``start_at_timetick``.

These read the log as the backend returns it (``raw=True, use_cache=False``). Then, on one
more pchannel, the scanner battery (``_scanner_conformance.py``) checks what readers see:
filters, every deliver policy, transaction visibility, checkpoint resume and durable
subscriptions, and the hand-off from the backend to the tail cache.

Messages the kit did not write are tolerated only if they are system messages (a WAL may
write timeticks of its own): they take part in the ordering checks and are otherwise
ignored. Every failure is an ``AssertionError`` naming the pchannel, the step and what
differed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final, NoReturn, final

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    InvalidArgument,
    WALClosed,
    WALError,
    WALFenced,
    WALReadOnly,
    WALTruncated,
)
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage, Message, MessageType
from walsvc.read._scanner import Scanner
from walsvc.wal._api import WAL

from ._exactly_once import ExactlyOnceCheck
from ._instruments import MARK, Reader, Sent, describe, difference, task_group
from ._scanner_conformance import ScannerCheck

__all__ = ("check_backend", "check_truncation")

_ROUNDS: Final = 3
_PRODUCERS: Final = 5
_READERS: Final = 2
#: How long ``latest()`` must stay silent when nothing is appended (Milvus waits 1 s).
_QUIET: Final = 0.2
_QUIET_AGAIN: Final = 0.05
_VCHANNELS: Final = ("v1", "v2", "", "v-\u00fc")
_TYPES: Final = (MessageType.INSERT, MessageType.DELETE, MessageType(10_001))


async def check_backend(
    open_wal_for: Callable[..., Awaitable[WAL]],
    *,
    message_count: int = 1000,
    pchannels: int = 3,
    hang_after: float = 60.0,
    truncation: bool = True,
    exactly_once: bool = True,
) -> None:
    """Run the conformance battery against the backend behind ``open_wal_for``.

    ``open_wal_for(pchannel, read_only=...)`` must open (each time anew) the given
    pchannel of one and the same log, e.g.
    ``lambda p, *, read_only: walsvc.open_wal(url, p, read_only=read_only)``. The kit uses
    ``pchannels`` fresh, randomly named pchannels concurrently and appends
    ``message_count`` messages per pchannel in each of three terms.

    Returns if the backend behaves as walsvc promises: reads in strictly increasing id
    order equal to what was acknowledged, exact seeks, a ``latest()`` that waits,
    read-only opens that read but refuse writes, ids and timeticks that keep increasing
    across reopens, fencing of an earlier writer, ``WALClosed`` after closing,
    truncation that no read can see past, and the scanner battery (filters, deliver
    policies, transactions, checkpoints and subscriptions, tail-cache hand-off).
    Raises ``AssertionError`` saying what differed otherwise; a step (one read, one
    append, one open) that takes longer than ``hang_after`` seconds counts as a hang and
    fails too. ``truncation=False`` leaves out the truncation step, for a backend whose
    store cannot truncate (a documented deviation; run ``check_truncation`` apart, e.g.
    as a strict xfail). ``exactly_once=False`` leaves out the exactly-once step, which
    needs the default interceptor chain (``interceptors.Dedup``) behind ``open_wal_for``.
    Every WAL the kit opens is closed before it returns or raises.
    """
    if message_count < 2:
        raise InvalidArgument(f"message_count must be at least 2, not {message_count!r}")
    if pchannels < 1:
        raise InvalidArgument(f"pchannels must be at least 1, not {pchannels!r}")
    if not hang_after > 0:
        raise InvalidArgument(f"hang_after must be positive, not {hang_after!r}")
    run = uuid.uuid4().hex[:12]
    async with task_group() as tg:
        for i in range(pchannels):
            check = _PChannelCheck(
                open_wal_for, f"conformance-{i}-{run}", message_count, hang_after
            )
            tg.create_task(check.run(truncation=truncation))
    # Only on a backend that passed the battery above: what readers see through it.
    await ScannerCheck(open_wal_for, f"conformance-scanners-{run}", hang_after).run()
    if exactly_once:
        await ExactlyOnceCheck(open_wal_for, f"conformance-keys-{run}", hang_after).run()


async def check_truncation(
    open_wal_for: Callable[..., Awaitable[WAL]], *, hang_after: float = 60.0
) -> None:
    """The truncation step of ``check_backend`` alone, on one fresh pchannel: ``truncate``
    hides every id up to and including its argument from every read, durably, and
    truncating the whole log leaves a log that reopens and keeps counting."""
    if not hang_after > 0:
        raise InvalidArgument(f"hang_after must be positive, not {hang_after!r}")
    pchannel = f"conformance-truncation-{uuid.uuid4().hex[:12]}"
    await _PChannelCheck(open_wal_for, pchannel, 2, hang_after).truncation()


@final
class _PChannelCheck:
    """The battery for one pchannel; ``written`` is the log as it must read back."""

    def __init__(
        self,
        opener: Callable[..., Awaitable[WAL]],
        pchannel: str,
        message_count: int,
        timeout: float,
    ) -> None:
        self._opener = opener
        self.pchannel = pchannel
        self.token = uuid.uuid4().hex
        self.timeout = timeout
        self._count = message_count
        self._calls = itertools.count()
        self._last_term = 0
        self.written: list[Sent] = []

    def fail(self, text: str, cause: BaseException | None = None) -> NoReturn:
        raise AssertionError(f"pchannel {self.pchannel!r}: {text}") from cause

    @contextlib.asynccontextmanager
    async def step(self, what: str, *, errors_fail: bool = True) -> AsyncIterator[None]:
        """Fail if the body takes longer than the kit's timeout or (with ``errors_fail``)
        raises anything but an ``AssertionError``."""
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                yield
        except AssertionError:
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError) and deadline.expired():
                self.fail(f"{what} did not finish within {self.timeout} s")
            if errors_fail:
                self.fail(f"{what} raised {type(exc).__name__}: {exc}", exc)
            raise

    # -- building blocks ------------------------------------------------------------------

    def message(
        self, label: str, i: int, *, type_: MessageType | None = None, **extra: str
    ) -> Message:
        """A message of the kit: vchannel, type and payload vary with ``i`` (empty
        payloads, the broadcast vchannel, an application type, a few larger payloads)."""
        unit = f"{label}:{i};".encode()
        payload = unit * (i % 5) if i % 97 != 1 else bytes(range(256)) * 32
        return Message(
            payload=payload,
            vchannel=_VCHANNELS[i % len(_VCHANNELS)],
            type=_TYPES[i % len(_TYPES)] if type_ is None else type_,
            properties={"id": f"{label}.{i}", "const": "t", MARK: self.token, **extra},
        )

    async def open(self, *, read_only: bool, when: str = "") -> WAL:
        mode = "read-only" if read_only else "read-write"
        async with self.step(f"opening {mode}{when}"):
            wal = await self._opener(self.pchannel, read_only=read_only)
        if not isinstance(wal, WAL):
            self.fail(f"open_wal_for returned {wal!r}, not a walsvc.WAL")
        try:
            if wal.pchannel != self.pchannel:
                self.fail(f"opened {mode}, the WAL's pchannel is {wal.pchannel!r}")
            if wal.read_only is not read_only:
                self.fail(f"opened {mode}, the WAL says read_only={wal.read_only!r}")
            if read_only:
                if wal.term != 0:
                    self.fail(f"a read-only WAL has term {wal.term}, expected 0")
            else:
                if not wal.term > self._last_term:
                    self.fail(
                        f"a new read-write open got term {wal.term}, not greater than the"
                        f" previous writer's term {self._last_term}"
                    )
                self._last_term = wal.term
        except BaseException:
            await wal.aclose()
            raise
        return wal

    def reader(self, wal: WAL, deliver: DeliverPolicy, name: str) -> Reader:
        return Reader(self, _backend_read(wal, deliver), f"{name} [{deliver.kind}]")

    def record(self, sent: Sequence[Sent]) -> None:
        """Add acknowledged messages (in id order) to ``written``, checking that ids and
        timeticks keep increasing."""
        previous = self.written[-1] if self.written else None
        for item in sent:
            if previous is not None:
                if not previous.result.message_id < item.result.message_id:
                    self.fail(
                        f"acknowledged ids not increasing: {item.result.message_id!r}"
                        f" (properties id {item.message.properties['id']!r}) after"
                        f" {previous.result.message_id!r}"
                    )
                if not previous.result.timetick < item.result.timetick:
                    self.fail(
                        "timeticks not increasing in log order: id"
                        f" {item.result.message_id!r} got {item.result.timetick}, id"
                        f" {previous.result.message_id!r} got {previous.result.timetick}"
                    )
            previous = item
        self.written.extend(sent)

    async def append(self, wal: WAL, message: Message) -> Sent:
        async with self.step("append"):
            result = await wal.append(message)
        sent = Sent(message, result, wal.term, next(self._calls))
        self.record([sent])
        return sent

    def same(self, what: str, expected: Sequence[Sent], got: Sequence[ImmutableMessage]) -> None:
        """Fail unless ``got`` is exactly ``expected``, message by message."""
        for index, (sent, message) in enumerate(zip(expected, got, strict=False)):
            diff = difference(sent, message)
            if diff is not None:
                self.fail(f"{what}: first difference at index {index}: {diff}")
        if len(got) < len(expected):
            missing = expected[len(got)]
            self.fail(
                f"{what}: expected {len(expected)} messages, got {len(got)}; first missing:"
                f" id {missing.result.message_id!r} (properties id"
                f" {missing.message.properties['id']!r})"
            )
        if len(got) > len(expected):
            self.fail(
                f"{what}: expected {len(expected)} messages, got {len(got)}; first extra:"
                f" {describe(got[len(expected)])}"
            )

    async def expect(self, error: type[WALError], what: str, call: Callable[[], object]) -> None:
        """Fail unless ``call`` (sync or async) raises ``error`` with a message."""
        try:
            async with self.step(what, errors_fail=False):
                result = call()
                if inspect.isawaitable(result):
                    await result
        except error as exc:
            if not str(exc):
                self.fail(f"{what} raised walsvc.{error.__name__} without a message")
            return
        except AssertionError:
            raise
        except Exception as exc:
            self.fail(
                f"{what} raised {type(exc).__name__}: {exc} instead of walsvc.{error.__name__}",
                exc,
            )
        self.fail(f"{what} succeeded; expected walsvc.{error.__name__}")

    async def expect_truncated(self, wal: WAL, deliver: DeliverPolicy, what: str) -> None:
        """Reading from a truncated position raises ``WALTruncated`` (from ``read`` or
        from the first step of the iteration)."""

        async def read_one() -> None:
            async with _backend_read(wal, deliver) as scanner:
                message = await anext(scanner)
                self.fail(f"{what}: delivered {describe(message)}; expected WALTruncated")

        await self.expect(WALTruncated, what, read_one)

    # -- the battery ------------------------------------------------------------------------

    async def run(self, *, truncation: bool) -> None:
        for round_ in range(1, _ROUNDS + 1):
            async with await self.open(read_only=False) as wal:
                await self.read_and_write(wal, round_)
            async with await self.open(read_only=True) as wal:
                await self.read_only(wal, f"round {round_}, read-only reopen")
        await self.fencing()
        await self.closing()
        if truncation:
            await self.truncation()

    async def read_and_write(self, wal: WAL, round_: int) -> None:
        readers = [
            self.reader(wal, DeliverPolicy.all(), f"round {round_} scanner {k}")
            for k in range(_READERS)
        ]
        async with task_group() as tg:
            produced = tg.create_task(self.produce(wal, round_))
            reads = [tg.create_task(self.read_all(r, round_)) for r in readers]

        new = sorted(produced.result(), key=lambda s: s.result.message_id)
        self.check_contiguous(produced.result(), new)
        if self.written and not self.written[-1].result.message_id < new[0].result.message_id:
            self.fail(
                f"round {round_}: ids did not keep increasing across reopen: first new id"
                f" {new[0].result.message_id!r} after {self.written[-1].result.message_id!r}"
            )
        self.record(new)
        for reader, read in zip(readers, reads, strict=True):
            self.same(reader.name, self.written, read.result())

        written = self.written
        mid = len(written) // 2
        for deliver, expected in (
            (DeliverPolicy.start_from(written[mid].result.message_id), written[mid:]),
            (DeliverPolicy.start_after(written[mid].result.message_id), written[mid + 1 :]),
            (DeliverPolicy.start_from(written[0].result.message_id), written),
            (DeliverPolicy.start_from(written[-1].result.message_id), written[-1:]),
        ):
            async with self.reader(wal, deliver, f"round {round_}") as reader:
                got = await reader.take(len(expected))
            self.same(f"{reader.name} {deliver.message_id!r}", expected, got)

        await self.latest(wal, round_)

    async def produce(self, wal: WAL, round_: int) -> list[Sent]:
        """Append ``message_count`` messages from concurrent producers, then the round's
        final (FLUSH) message; return what was acknowledged."""
        label = f"r{round_}"
        last = self._count - 1
        sent: list[Sent] = []

        async def one_by_one(indices: Sequence[int]) -> None:
            for i in indices:
                message = self.message(label, i)
                result = await wal.append(message)
                sent.append(Sent(message, result, wal.term, next(self._calls)))

        async def in_batches(indices: Sequence[int]) -> None:
            size, pos = 1, 0
            while pos < len(indices):
                batch = [self.message(label, i) for i in indices[pos : pos + size]]
                results = await wal.append_many(batch)
                if len(results) != len(batch):
                    self.fail(f"append_many of {len(batch)} messages returned {len(results)}")
                call = next(self._calls)
                sent.extend(Sent(m, r, wal.term, call) for m, r in zip(batch, results, strict=True))
                pos += size
                size = size % 8 + 1

        async with self.step(f"round {round_}: {_PRODUCERS} producers appending"):
            async with task_group() as tg:
                for p in range(_PRODUCERS):
                    indices = range(p, last, _PRODUCERS)
                    tg.create_task(in_batches(indices) if p % 2 else one_by_one(indices))
            final = self.message(label, last, type_=MessageType.FLUSH, final=str(round_))
            result = await wal.append(final)
        sent.append(Sent(final, result, wal.term, next(self._calls)))
        return sent

    async def read_all(self, reader: Reader, round_: int) -> list[ImmutableMessage]:
        async with reader:
            return await reader.until_final(round_)

    def check_contiguous(self, in_call_order: Sequence[Sent], new: Sequence[Sent]) -> None:
        """The messages of one ``append_many`` call land contiguously and in call order;
        ``new`` is ``in_call_order`` sorted by id."""
        position = {s.result.message_id: i for i, s in enumerate(new)}
        if len(position) != len(new):
            self.fail("two appends were acknowledged with the same id")
        calls: dict[int, list[int]] = {}
        for s in in_call_order:
            calls.setdefault(s.call, []).append(position[s.result.message_id])
        for positions in calls.values():
            if positions != list(range(positions[0], positions[0] + len(positions))):
                ids = [new[p].result.message_id for p in positions]
                self.fail(f"one append_many call did not land contiguously and in order: {ids}")

    async def latest(self, wal: WAL, round_: int) -> None:
        """``latest()`` waits while nothing is appended, wakes on an append, and survives
        a read cut short by the caller's deadline."""
        async with self.reader(wal, DeliverPolicy.latest(), f"round {round_}") as reader:
            pending = asyncio.ensure_future(reader.next())
            try:
                done, _ = await asyncio.wait({pending}, timeout=_QUIET)
                if done:
                    self.fail(
                        f"{reader.name}: delivered {describe(pending.result())} although"
                        " nothing was appended after the scanner was created"
                    )
                sent = await self.append(wal, self.message(f"r{round_}-latest", 1))
                self.same(f"{reader.name}, woken by an append", [sent], [await pending])
            finally:
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pending
            try:
                early = await asyncio.wait_for(reader.next(), _QUIET_AGAIN)
            except TimeoutError:
                pass
            else:
                self.fail(f"{reader.name}: delivered {describe(early)} out of nowhere")
            sent = await self.append(wal, self.message(f"r{round_}-latest", 2))
            self.same(
                f"{reader.name}, after a read was cancelled by a deadline",
                [sent],
                [await reader.next()],
            )

    async def read_only(self, wal: WAL, what: str) -> None:
        """A read-only WAL reads everything and refuses writes."""
        async with self.reader(wal, DeliverPolicy.all(), what) as reader:
            got = await reader.take(len(self.written))
        self.same(reader.name, self.written, got)
        newest = self.written[-1].result.message_id
        async with self.step(f"{what}: latest_message_id"):
            latest = await wal.latest_message_id()
        if latest is None or latest < newest:
            self.fail(f"{what}: latest_message_id() is {latest!r}; {newest!r} was written")
        message = self.message("read-only", 0)
        await self.expect(WALReadOnly, f"{what}: append", lambda: wal.append(message))
        await self.expect(
            WALReadOnly, f"{what}: append_many", lambda: wal.append_many([message, message])
        )
        await self.expect(WALReadOnly, f"{what}: truncate", lambda: wal.truncate(newest))

    async def fencing(self) -> None:
        """A read-write open fences the earlier writer (no more appends, no truncation);
        the new writer reads what the old one had acknowledged and keeps working after the
        old one closes."""
        first = await self.open(read_only=False)
        try:
            for i in range(3):
                await self.append(first, self.message("fence-old", i))
            batch = [self.message("fence-old", i) for i in range(3, 5)]
            async with self.step("append_many"):
                results = await first.append_many(batch)
            call = next(self._calls)
            self.record([Sent(m, r, first.term, call) for m, r in zip(batch, results, strict=True)])
            async with await self.open(read_only=False) as second:
                message = self.message("fenced", 0)
                await self.expect(
                    WALFenced, "append by a fenced writer", lambda: first.append(message)
                )
                await self.expect(
                    WALFenced,
                    "append_many by a fenced writer",
                    lambda: first.append_many([message, message]),
                )
                oldest = self.written[0].result.message_id
                await self.expect(
                    WALFenced, "truncate by a fenced writer", lambda: first.truncate(oldest)
                )
                await first.aclose()
                await self.append(second, self.message("fence-new", 0))
                async with self.reader(second, DeliverPolicy.all(), "new writer") as reader:
                    got = await reader.take(len(self.written))
                self.same(reader.name, self.written, got)
                await self.append(second, self.message("fence-new", 1))
        finally:
            await first.aclose()

    async def closing(self) -> None:
        """Scanners and calls on a closed WAL: ``WALClosed``; a scanner its owner closes
        ends its iteration, even with messages fetched but not yet delivered."""
        wal = await self.open(read_only=False)
        try:
            tailing = wal.read(DeliverPolicy.latest())
            buffered = wal.read(DeliverPolicy.all())
            owned = wal.read(DeliverPolicy.latest())
            owned_buffered = wal.read(DeliverPolicy.all())
            async with self.step("reading the first message"):
                await anext(buffered)
                await anext(owned_buffered)

            async def next_or_end(scanner: Scanner) -> ImmutableMessage | None:
                """The next message the kit wrote (timeticks the WAL writes are skipped),
                or None when the iteration ends."""
                try:
                    while True:
                        message = await anext(scanner)
                        if not message.type.is_system:
                            return message
                except StopAsyncIteration:
                    return None

            tailing_read = asyncio.ensure_future(next_or_end(tailing))
            owned_read = asyncio.ensure_future(next_or_end(owned))
            try:
                await asyncio.wait({tailing_read, owned_read}, timeout=_QUIET_AGAIN)
                async with self.step("closing a scanner"):
                    await owned.aclose()
                    await owned_buffered.aclose()
                    ended = await owned_read
                if ended is not None:
                    self.fail(
                        "a pending read on a scanner its owner closed delivered"
                        f" {describe(ended)} instead of ending the iteration"
                    )
                for name, scanner in (("pending", owned), ("buffered", owned_buffered)):
                    async with self.step("iterating a closed scanner"):
                        left = [m async for m in scanner]
                    if left:
                        self.fail(
                            f"a {name} scanner its owner closed delivered {describe(left[0])}"
                            " instead of ending the iteration"
                        )
                async with self.step("closing the WAL"):
                    await wal.aclose()
                await self.expect(
                    WALClosed, "a read pending when the WAL closed", lambda: tailing_read
                )
                await self.expect(
                    WALClosed,
                    "the next read of a scanner with messages fetched when the WAL closed",
                    lambda: anext(buffered),
                )
            finally:
                for task in (tailing_read, owned_read):
                    if not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, WALError):
                            await task
            newest = self.written[-1].result.message_id
            message = self.message("closed", 0)
            for what, call in (
                ("append", lambda: wal.append(message)),
                ("append_many", lambda: wal.append_many([message])),
                ("read", lambda: wal.read()),
                ("latest_message_id", lambda: wal.latest_message_id()),
                ("truncate", lambda: wal.truncate(newest)),
            ):
                await self.expect(WALClosed, f"{what} on a closed WAL", call)
            async with self.step("closing a closed WAL"):
                await wal.aclose()
            if not wal.closed:
                self.fail("WAL.closed is False after aclose()")
        finally:
            await wal.aclose()

    async def truncation(self) -> None:
        """``truncate(id)`` hides every id up to and including ``id`` from every read,
        durably; truncating the whole log leaves a log that reopens and keeps counting."""
        async with await self.open(read_only=False) as wal:
            for i in range(6):
                await self.append(wal, self.message("truncate", i))
            first = self.written[0].result.message_id
            cut_at = len(self.written) - 3
            cut = self.written[cut_at].result.message_id
            async with self.step("truncate"):
                await wal.truncate(cut)
            self.written = self.written[cut_at + 1 :]
            await self.read_after_truncation(wal, cut, "after truncate")
            await self.expect_truncated(
                wal, DeliverPolicy.start_from(cut), "start_from(the truncation point)"
            )
            await self.expect_truncated(
                wal, DeliverPolicy.start_from(first), "start_from(the first id ever written)"
            )
            await self.append(wal, self.message("truncate", 6))
        async with await self.open(read_only=True) as wal:
            await self.read_after_truncation(wal, cut, "read-only reopen after truncate")
            await self.expect_truncated(
                wal, DeliverPolicy.start_from(cut), "read-only reopen: start_from(truncated)"
            )
        async with await self.open(read_only=False) as wal:
            last = self.written[-1]
            async with self.step("truncate through the newest message"):
                await wal.truncate(last.result.message_id)
            self.written = []
        when = " after truncating the whole log"
        async with await self.open(read_only=False, when=when) as wal:
            sent = await self.append(wal, self.message("after-truncating-everything", 0))
            if not last.result.message_id < sent.result.message_id:
                self.fail(
                    f"after truncating the whole log and reopening, an append got id"
                    f" {sent.result.message_id!r}, not after {last.result.message_id!r}"
                )
            if not last.result.timetick < sent.result.timetick:
                self.fail(
                    f"after truncating the whole log and reopening, an append got timetick"
                    f" {sent.result.timetick}, not after {last.result.timetick}"
                )
            await self.read_after_truncation(
                wal, last.result.message_id, "after truncating everything"
            )

    async def read_after_truncation(self, wal: WAL, cut: MessageId, what: str) -> None:
        for deliver, expected in (
            (DeliverPolicy.all(), self.written),
            (DeliverPolicy.start_after(cut), self.written),
        ):
            reader = Reader(
                self, _backend_read(wal, deliver), f"{what} [{deliver.kind}]", floor=cut
            )
            async with reader:
                got = await reader.take(len(expected))
            self.same(reader.name, expected, got)


def _backend_read(wal: WAL, deliver: DeliverPolicy) -> Scanner:
    """A scanner of the log exactly as the backend stores and returns it: the battery
    checks the backend, so neither the tail cache nor the reorder and transaction stages
    may stand in front of it (the scanner battery checks those)."""
    return wal.read(deliver, raw=True, use_cache=False)
