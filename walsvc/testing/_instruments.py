"""The conformance kit's instruments: what it sent, how it compares a message with what
came back, and a reader that turns hangs and stray messages into clear failures."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Final, NamedTuple, final

from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, Message, MessageType
from walsvc.read._scanner import Scanner

if TYPE_CHECKING:
    from ._pchannel_kit import PChannelKit

__all__ = ("MARK", "Reader", "Sent", "describe", "difference", "leaves", "task_group")

#: Property key carrying the token of one pchannel's run: the kit's own messages.
MARK: Final = "walsvc.testing"


class Sent(NamedTuple):
    """A message the kit appended and what the WAL acknowledged for it."""

    message: Message
    result: AppendResult
    term: int
    call: int  # which append call; the messages of one append_many share it


@contextlib.asynccontextmanager
async def task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """A TaskGroup whose failures surface as the failing task's own exception (an
    ``AssertionError`` first), not as an exception group the caller must unpack."""
    try:
        async with asyncio.TaskGroup() as tg:
            yield tg
    except BaseExceptionGroup as group:
        errors = list(leaves(group))
        if not all(isinstance(leaf, Exception) for leaf in errors):
            raise
        first = next((e for e in errors if isinstance(e, AssertionError)), errors[0])
        for other in errors:
            if other is not first:
                first.add_note(f"also failed concurrently: {type(other).__name__}: {other}")
        raise first from None


def leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from leaves(exc)
        else:
            yield exc


def describe(message: ImmutableMessage) -> str:
    return (
        f"id {message.message_id!r} (type {message.type.name}, vchannel {message.vchannel!r},"
        f" properties {dict(message.properties)!r})"
    )


def difference(sent: Sent, got: ImmutableMessage) -> str | None:
    """What differs between an acknowledged message and the one read back, or None."""
    want = sent.message
    if got.message_id != sent.result.message_id:
        return (
            f"expected id {sent.result.message_id!r} (properties id"
            f" {want.properties['id']!r}), got {describe(got)}"
        )
    diffs = []
    if got.timetick != sent.result.timetick:
        diffs.append(f"timetick {got.timetick} != acknowledged {sent.result.timetick}")
    if got.term != sent.term:
        diffs.append(f"term {got.term} != writer's term {sent.term}")
    if got.vchannel != want.vchannel:
        diffs.append(f"vchannel {got.vchannel!r} != {want.vchannel!r}")
    if got.type != want.type:
        diffs.append(f"type {got.type!r} != {want.type!r}")
    if got.payload != want.payload:
        at = next(
            (i for i, (a, b) in enumerate(zip(got.payload, want.payload, strict=False)) if a != b),
            min(len(got.payload), len(want.payload)),
        )
        diffs.append(
            f"payload of {len(got.payload)} bytes != {len(want.payload)} bytes written,"
            f" first difference at byte {at}"
        )
    if dict(got.properties) != dict(want.properties):
        diffs.append(f"properties {dict(got.properties)!r} != {dict(want.properties)!r}")
    if got.idempotency_key != want.idempotency_key:
        diffs.append(f"idempotency_key {got.idempotency_key!r} != {want.idempotency_key!r}")
    if not diffs:
        return None
    return f"message {got.message_id!r}: " + "; ".join(diffs)


@final
class Reader:
    """A scanner under test: checks every delivery as it comes and returns the kit's own
    messages (those carrying the run's token)."""

    def __init__(
        self,
        check: PChannelKit,
        scanner: Scanner,
        name: str,
        floor: MessageId | None = None,
    ) -> None:
        self._check = check
        self.scanner = scanner
        self.name = name
        self._floor = floor
        self._delivered = 0
        self._last: MessageId | None = None
        self._last_tick: int | None = None

    async def next(self) -> ImmutableMessage:
        """The next message the kit wrote, checking what comes before it."""
        async with self.watch():
            return await self._next()

    async def take(self, count: int) -> list[ImmutableMessage]:
        """The next ``count`` messages the kit wrote."""
        async with self.watch():
            return [await self._next() for _ in range(count)]

    async def until_final(self, round_: int) -> list[ImmutableMessage]:
        """The kit's messages up to and including the final message of ``round_``."""
        got = []
        async with self.watch():
            while True:
                message = await self._next()
                got.append(message)
                if message.properties.get("final") == str(round_):
                    return got

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[None]:
        """Fail, saying how far the scanner got, if reading takes longer than the kit's
        timeout (one deadline per read, not per message: timers are not free)."""
        check = self._check
        deadline = asyncio.timeout(check.timeout)
        try:
            async with deadline:
                yield
        except TimeoutError:
            if deadline.expired():
                check.fail(
                    f"{self.name}: still waiting for a message after {check.timeout} s,"
                    f" {self._delivered} delivered (last id {self._last!r})"
                )
            raise

    async def _next(self) -> ImmutableMessage:
        check = self._check
        while True:
            try:
                message = await anext(self.scanner)
            except StopAsyncIteration:
                check.fail(
                    f"{self.name}: iteration ended after {self._delivered} messages although"
                    " nobody closed the scanner"
                )
            except (AssertionError, asyncio.CancelledError):
                raise
            except Exception as exc:
                check.fail(
                    f"{self.name}: reading raised {type(exc).__name__}: {exc} after"
                    f" {self._delivered} messages (last id {self._last!r})",
                    exc,
                )
            if not isinstance(message, ImmutableMessage):
                check.fail(f"{self.name}: delivered {message!r}, not a walsvc.ImmutableMessage")
            if not message.persisted:
                # An idle TimeTick: it repeats the newest message's id; only its tick moves.
                if message.type is not MessageType.TIME_TICK:
                    check.fail(f"{self.name}: delivered {describe(message)}, not persisted")
                if self._last_tick is not None and message.timetick <= self._last_tick:
                    check.fail(
                        f"{self.name}: idle {describe(message)} does not advance the tick"
                        f" beyond {self._last_tick}"
                    )
                self._last_tick = message.timetick
                continue
            message_id = message.message_id
            if self._last is not None and not self._last < message_id:
                check.fail(
                    f"{self.name}: ids not strictly increasing: delivery #{self._delivered}"
                    f" is {describe(message)} after id {self._last!r}"
                )
            if self._floor is not None and message_id <= self._floor:
                check.fail(
                    f"{self.name}: delivered {describe(message)}, at or before the"
                    f" truncation point {self._floor!r}"
                )
            if self._last_tick is not None and message.timetick <= self._last_tick:
                check.fail(
                    f"{self.name}: {describe(message)} does not advance the timetick beyond"
                    f" {self._last_tick}: log order must equal timetick order"
                )
            self._last_tick = message.timetick
            self._delivered += 1
            self._last = message_id
            if message.properties.get(MARK) == check.token:
                return message
            if not message.type.is_system:
                check.fail(
                    f"{self.name}: delivered {describe(message)}, which the kit never wrote"
                    " and which is not a system message"
                )

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.scanner.aclose()
