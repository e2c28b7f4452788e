"""The conformance kit's scanner battery: what readers see through ``WAL.read`` on a
backend, with the tail cache (a writer) and without it (a read-only open).

On one fresh pchannel: header filters (vchannel, types, timetick floors), every deliver
policy, transaction visibility (nothing until commit, then one TXN message; rollbacks
never), checkpoint resume (``DeliverPolicy.from_checkpoint`` and a durable subscription
across a writer restart), and the hand-off of a reader that starts behind from the
backend to the tail cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, NoReturn, final

import msgspec

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._filter import Filter
from walsvc.core._message import AppendResult, ImmutableMessage, Message, MessageType
from walsvc.read._scanner import Scanner
from walsvc.wal._api import WAL

__all__ = ("ScannerCheck",)

_QUIET: Final = 0.1
_VCHANNELS: Final = ("a", "b", "")
_TYPES: Final = (MessageType.INSERT, MessageType.DELETE)


@final
class ScannerCheck:
    """The scanner battery for one pchannel (see the module docstring)."""

    def __init__(
        self, opener: Callable[..., Awaitable[WAL]], pchannel: str, timeout: float
    ) -> None:
        self._opener = opener
        self.pchannel = pchannel
        self._timeout = timeout
        # The log as readers must see it: data messages and committed transactions.
        self.visible: list[ImmutableMessage] = []

    def fail(self, text: str) -> NoReturn:
        raise AssertionError(f"pchannel {self.pchannel!r}, scanners: {text}")

    async def take(self, scanner: Scanner, count: int, what: str) -> list[ImmutableMessage]:
        """The next ``count`` messages that are not TimeTicks."""
        out: list[ImmutableMessage] = []
        while len(out) < count:
            try:
                message = await asyncio.wait_for(anext(scanner), self._timeout)
            except TimeoutError:
                self.fail(f"{what}: still waiting after {self._timeout} s, got {len(out)}/{count}")
            if message.type is not MessageType.TIME_TICK:
                out.append(message)
        return out

    async def quiet(self, scanner: Scanner, what: str) -> None:
        """Fail if a data message arrives within a short while."""
        try:
            async with asyncio.timeout(_QUIET):
                while True:
                    message = await anext(scanner)
                    if message.type is not MessageType.TIME_TICK:
                        self.fail(f"{what}: unexpected {message.type.name} {message.message_id!r}")
        except TimeoutError:
            pass

    def same(
        self, what: str, expected: Sequence[ImmutableMessage], got: Sequence[ImmutableMessage]
    ) -> None:
        want = [(m.message_id, m.type, m.body) for m in expected]
        have = [(m.message_id, m.type, m.body) for m in got]
        if want != have:
            self.fail(f"{what}: expected {_ids(expected)}, got {_ids(got)}")

    async def run(self) -> None:
        async with await self._opener(self.pchannel, read_only=False) as wal:
            await self.write(wal)
            await self.policies(wal, "writer (tail cache)")
            await self.filters(wal, "writer (tail cache)")
            await self.transactions(wal)
            await self.hand_off(wal)
        async with await self._opener(self.pchannel, read_only=True) as wal:
            await self.policies(wal, "read-only (backend)")
            await self.filters(wal, "read-only (backend)")
        await self.subscription()

    async def write(self, wal: WAL) -> None:
        """Data on three vchannels and two types, and transactions: one committed, one
        rolled back; ``visible`` becomes what every reader must see."""
        async with wal.read(DeliverPolicy.latest()) as reader:
            sent: list[AppendResult] = []
            for i in range(30):
                vchannel, type_ = _VCHANNELS[i % 3], _TYPES[i % 2]
                sent.append(
                    await wal.append(Message(payload=b"%d" % i, vchannel=vchannel, type=type_))
                )
                if i == 10:
                    async with wal.txn("a") as txn:
                        await txn.append(Message(payload=b"t1", vchannel="a"))
                        await txn.append(
                            Message(payload=b"t2", vchannel="a", type=MessageType.DELETE)
                        )
                if i == 20:
                    dropped = await wal.begin_txn("b")
                    await dropped.append(Message(payload=b"never", vchannel="b"))
                    await dropped.rollback()
            self.visible = await self.take(reader, 31, "the writer's tailing reader")
        kinds = [m.type for m in self.visible]
        if kinds.count(MessageType.TXN) != 1 or len(self.visible) != 31:
            self.fail(f"expected 30 data messages and one TXN, got {[k.name for k in kinds]}")
        committed = self.visible[11]
        if committed.type is not MessageType.TXN or [m.payload for m in committed.body] != [
            b"t1",
            b"t2",
        ]:
            self.fail(f"the committed transaction reads as {committed!r}")
        if any(m.timetick != committed.timetick for m in committed.body):
            self.fail("a transaction's body messages must carry its commit's timetick")

    async def policies(self, wal: WAL, where: str) -> None:
        visible = self.visible
        mid = visible[15]
        for deliver, expected in (
            (DeliverPolicy.all(), visible),
            (DeliverPolicy.start_from(mid.message_id), visible[15:]),
            (DeliverPolicy.start_after(mid.message_id), visible[16:]),
            (DeliverPolicy.from_checkpoint(mid.checkpoint), visible[16:]),
            (DeliverPolicy.from_checkpoint(visible[11].checkpoint), visible[12:]),
        ):
            what = f"{where}: {deliver.kind} {deliver.message_id!r}"
            async with wal.read(deliver) as scanner:
                self.same(what, expected, await self.take(scanner, len(expected), what))
                await self.quiet(scanner, what)
        async with wal.read(DeliverPolicy.latest()) as scanner:
            await self.quiet(scanner, f"{where}: latest before any append")

    async def filters(self, wal: WAL, where: str) -> None:
        floor = self.visible[20].timetick
        for name, selected in (
            ("vchannel a", [Filter(vchannels=["a"])]),
            ("types DELETE", [Filter(types=[MessageType.DELETE])]),
            ("timetick > floor", [Filter(min_timetick=floor + 1)]),
            (
                "vchannel b, timetick >= floor",
                [Filter(vchannels=["b"]), Filter(min_timetick=floor)],
            ),
        ):
            combined = Filter.combine(selected)
            expected = [e for m in self.visible if (e := _expected(combined, m)) is not None]
            what = f"{where}: filter {name}"
            async with wal.read(filters=selected) as scanner:
                self.same(what, expected, await self.take(scanner, len(expected), what))
                await self.quiet(scanner, what)

    async def transactions(self, wal: WAL) -> None:
        async with wal.read(DeliverPolicy.latest()) as reader:
            txn = await wal.begin_txn("a")
            await txn.append(Message(payload=b"open", vchannel="a"))
            await self.quiet(reader, "a transaction still open")
            result = await txn.commit()
            (got,) = await self.take(reader, 1, "a committed transaction")
        if got.type is not MessageType.TXN or got.message_id != result.message_id:
            self.fail(f"a commit reads as {got!r}, expected a TXN at {result.message_id!r}")
        self.visible.append(got)

    async def hand_off(self, wal: WAL) -> None:
        """A reader that starts behind the cache reads the backend, then the cache. The
        switch may lag by a message or two (the backend can show a record before the
        writer puts it in the cache), so new messages keep coming until it happened."""
        async with wal.read() as behind:
            old = await self.take(behind, len(self.visible), "a reader starting behind")
            self.same("a reader starting behind", self.visible, old)
            for i in range(10):
                result = await wal.append(Message(payload=b"new %d" % i, vchannel="a"))
                (new,) = await self.take(behind, 1, "after catching up")
                if new.message_id != result.message_id:
                    self.fail(f"after catching up, got {new!r}, expected {result.message_id!r}")
                self.visible.append(new)
                stats = behind.stats()
                if stats.source == "cache":
                    return
        self.fail(f"a reader that caught up still reads the {stats.source}: {stats}")

    async def subscription(self) -> None:
        """Acknowledged messages are not delivered again after a writer restart."""
        async with await self._opener(self.pchannel, read_only=False) as wal:
            async with wal.read(subscription="kit") as scanner:
                first = await self.take(scanner, 10, "subscription, first reader")
                for message in first:
                    await scanner.ack(message)
        async with await self._opener(self.pchannel, read_only=False) as wal:
            async with wal.read(subscription="kit") as scanner:
                rest = await self.take(scanner, len(self.visible) - 10, "subscription, resumed")
                await self.quiet(scanner, "subscription, resumed")
        self.same("a resumed subscription", self.visible, first + rest)


def _expected(selected: Filter, message: ImmutableMessage) -> ImmutableMessage | None:
    """``message`` as a reader with ``selected`` sees it: a TXN (a system type, its tick
    its commit's) with only the body messages the vchannel and type filters admit."""
    if message.type is not MessageType.TXN:
        return message if selected.admits(message) else None
    if message.timetick < selected.min_timetick or not Filter(vchannels=selected.vchannels).admits(
        message
    ):
        return None
    body_filter = Filter(vchannels=selected.vchannels, types=selected.types)
    body = tuple(m for m in message.body if body_filter.admits(m))
    return msgspec.structs.replace(message, body=body)


def _ids(messages: Sequence[ImmutableMessage]) -> str:
    return ", ".join(f"{m.message_id!r}:{m.type.name}" for m in messages)
