"""The building blocks of one pchannel's conformance steps (``_pchannel_check.py``).

``PChannelKit`` holds the log as it must read back (``written``) and the last writer's
term, and makes what the steps are made of: the kit's messages, opens checked for
pchannel, mode and term, appends recorded with ids and timeticks checked to increase,
steps bounded by the kit's timeout, expected errors, and reads compared with what was
written message by message. It reads the log as the backend returns it
(``backend_read``: ``raw=True, use_cache=False``). Every failure is an ``AssertionError``
naming the pchannel and what differed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final, NoReturn

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALError, WALTruncated
from walsvc.core._message import ImmutableMessage, Message, MessageType
from walsvc.read._scanner import Scanner
from walsvc.wal._api import WAL

from ._instruments import MARK, Reader, Sent, describe, difference

__all__ = ("PChannelKit", "backend_read")

_VCHANNELS: Final = ("v1", "v2", "", "v-\u00fc")
_TYPES: Final = (MessageType.INSERT, MessageType.DELETE, MessageType(10_001))


class PChannelKit:
    """The state and building blocks of the battery for one pchannel (see the module);
    ``written`` is the log as it must read back."""

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
        return Reader(self, backend_read(wal, deliver), f"{name} [{deliver.kind}]")

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
            async with backend_read(wal, deliver) as scanner:
                message = await anext(scanner)
                self.fail(f"{what}: delivered {describe(message)}; expected WALTruncated")

        await self.expect(WALTruncated, what, read_one)


def backend_read(wal: WAL, deliver: DeliverPolicy) -> Scanner:
    """A scanner of the log exactly as the backend stores and returns it: the battery
    checks the backend, so neither the tail cache nor the reorder and transaction stages
    may stand in front of it (the scanner battery checks those)."""
    return wal.read(deliver, raw=True, use_cache=False)
