"""One pchannel's part of ``check_backend`` (steps 1 to 4 of ``_conformance.py``), in the
order ``PChannelCheck.run`` takes them: three terms of concurrent appends and reads
(``read_and_write``: ids and timeticks increasing, ``append_many`` contiguous, exact
seeks, a ``latest()`` that waits), each followed by a read-only reopen that reads
everything and is refused writes; fencing of an earlier writer; closing; and truncation,
durable across reopens (``check_truncation`` runs it alone). Built from
``_pchannel_kit.py``'s building blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Final, final

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALClosed, WALError, WALFenced, WALReadOnly
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage, MessageType
from walsvc.read._scanner import Scanner
from walsvc.wal._api import WAL

from ._instruments import Reader, Sent, describe, task_group
from ._pchannel_kit import PChannelKit, backend_read

__all__ = ("PChannelCheck",)

_ROUNDS: Final = 3
_PRODUCERS: Final = 5
_READERS: Final = 2
#: How long ``latest()`` must stay silent when nothing is appended (Milvus waits 1 s).
_QUIET: Final = 0.2
_QUIET_AGAIN: Final = 0.05


@final
class PChannelCheck(PChannelKit):
    """The battery for one pchannel (see the module); ``run`` takes every step in order."""

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
            reader = Reader(self, backend_read(wal, deliver), f"{what} [{deliver.kind}]", floor=cut)
            async with reader:
                got = await reader.take(len(expected))
            self.same(reader.name, expected, got)
