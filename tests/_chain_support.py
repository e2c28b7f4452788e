"""What the interceptor tests share: an injected clock, WAL openers and log helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import interceptors
import walsvc
from walsvc import AppendResult, HybridClock, ImmutableMessage, Message
from walsvc.core._chain import AppendBatchNext, AppendNext

__all__ = (
    "BatchSizes",
    "FakeClock",
    "HoldBatches",
    "data",
    "log_of",
    "member",
    "open_manual",
    "whole_log",
)


class FakeClock:
    """Wall-clock milliseconds that move only when a test says so."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


async def open_manual(
    url: str, clock: FakeClock, *, pchannel: str = "p0", **kwargs: Any
) -> walsvc.WAL:
    """A WAL on the fake clock whose timetick sync runs only when the test says so, with
    its dedup window rebuilt."""
    kwargs.setdefault("interceptors", interceptors.default_chain(sync_interval=None))
    allocator = HybridClock(now_ms=clock)
    wal = await walsvc.open_wal(url, pchannel, timetick_allocator=allocator, **kwargs)
    await wal.wait_ready()
    for dedup in (m for m in wal.interceptors if isinstance(m, interceptors.Dedup)):
        # The window is rebuilt in the background by a scanner, which counts as a
        # listener for idle ticks while it reads: tests start once nobody reads.
        await dedup.wait_rebuilt()
    return wal


def member(wal: walsvc.WAL, kind: type[Any]) -> Any:
    (found,) = [m for m in wal.interceptors if isinstance(m, kind)]
    return found


async def whole_log(url: str, pchannel: str) -> list[ImmutableMessage]:
    """The raw log of ``pchannel`` up to its newest message, through a read-only open (no
    tail cache, no interceptors)."""
    async with await walsvc.open_wal(url, pchannel, read_only=True) as wal:
        return await log_of(wal)


async def log_of(wal: walsvc.WAL) -> list[ImmutableMessage]:
    """Everything in the log as stored, up to the newest message."""
    latest = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    if latest is None:
        return out
    async with wal.read(raw=True) as scanner:
        async for message in scanner:
            if message.persisted:
                out.append(message)
            if message.message_id == latest:
                return out
    return out


def data(payload: bytes, vchannel: str = "v1", **kwargs: Any) -> Message:
    return Message(payload=payload, vchannel=vchannel, **kwargs)


async def take(scanner: walsvc.Scanner, count: int, within: float = 30) -> list[ImmutableMessage]:
    """The next ``count`` messages of ``scanner`` (``TimeoutError`` past ``within`` s)."""
    taken: list[ImmutableMessage] = []
    async with asyncio.timeout(within):
        async for message in scanner:
            taken.append(message)
            if len(taken) == count:
                break
    return taken


class BatchSizes:
    """A pass-through interceptor (innermost) that records how appends reach it: the size
    of every batch, and 1 for every single append."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        self.sizes.append(1)
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        self.sizes.append(len(messages))
        return await call_next(messages)


class HoldBatches(BatchSizes):
    """``BatchSizes`` that also holds every append (``holding`` set) until ``release``
    is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        self.holding.set()
        await self.release.wait()
        return await super().do_append(message, call_next)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        self.holding.set()
        await self.release.wait()
        return await super().do_append_batch(messages, call_next)
