"""Exclusive (DDL) messages: CreateCollection, DropCollection, CreatePartition,
DropPartition and ManualFlush serialize per vchannel.

An exclusive message on vchannel V waits until every append on V that started before it
finished, holds back appends on V that start after it, rolls back V's open transactions
(their RollbackTxns land before it), and only then is appended. Appends on other
vchannels are not affected. The broadcast vchannel "" is a vchannel of its own here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import final

from walsvc import EXCLUSIVE_TYPES, AppendResult, Message
from walsvc._chain import AppendBatchNext, AppendNext

__all__ = ("ExclusiveLock",)

#: Rolls back the open transactions of a vchannel, with a reason.
AbortVchannel = Callable[[str, str], Awaitable[None]]


@final
class _Gate:
    """One vchannel's exclusive section: closed while an exclusive message is pending."""

    __slots__ = ("drained", "lock", "opened", "pending")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # exclusive messages of the vchannel, one at a time
        self.pending = 0  # exclusive messages waiting or running
        self.opened = asyncio.Event()
        self.drained: asyncio.Event | None = None


@final
class ExclusiveLock:
    """Serializes exclusive messages per vchannel and fails the vchannel's open
    transactions through ``abort_transactions`` (the default chain wires it to
    ``Transactions.abort_vchannel``)."""

    __slots__ = ("_abort", "_gates", "_in_flight")

    def __init__(self, abort_transactions: AbortVchannel | None = None) -> None:
        self._abort = abort_transactions
        self._in_flight: dict[str, int] = {}
        self._gates: dict[str, _Gate] = {}

    def do_append(self, message: Message, call_next: AppendNext) -> Awaitable[AppendResult]:
        """Exclusive messages take their vchannel's gate; others pass it (or wait)."""
        if message.type in EXCLUSIVE_TYPES:
            return self._exclusive(message, call_next)
        return self._shared(message, call_next)

    async def _shared(self, message: Message, call_next: AppendNext) -> AppendResult:
        vchannel = message.vchannel
        gate = self._gates.get(vchannel)
        while gate is not None:
            await gate.opened.wait()
            gate = self._gates.get(vchannel)
        in_flight = self._in_flight
        in_flight[vchannel] = in_flight.get(vchannel, 0) + 1
        try:
            return await call_next(message)
        finally:
            self._leave(vchannel)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        """A batch with an exclusive message goes one message at a time; any other batch
        passes the gates of all its vchannels at once."""
        if any(m.type in EXCLUSIVE_TYPES for m in messages):
            one = _single(call_next)
            return [await self.do_append(message, one) for message in messages]
        vchannels = {m.vchannel for m in messages}
        while any(v in self._gates for v in vchannels):
            for v in vchannels:
                gate = self._gates.get(v)
                if gate is not None:
                    await gate.opened.wait()
        in_flight = self._in_flight
        for v in vchannels:
            in_flight[v] = in_flight.get(v, 0) + 1
        try:
            return await call_next(messages)
        finally:
            for v in vchannels:
                self._leave(v)

    def _leave(self, vchannel: str) -> None:
        """An append on ``vchannel`` finished; the last one wakes a pending DDL."""
        count = self._in_flight[vchannel] - 1
        if count:
            self._in_flight[vchannel] = count
            return
        del self._in_flight[vchannel]
        gate = self._gates.get(vchannel)
        if gate is not None and gate.drained is not None:
            gate.drained.set()

    async def _exclusive(self, message: Message, call_next: AppendNext) -> AppendResult:
        vchannel = message.vchannel
        gate = self._gates.get(vchannel)
        if gate is None:
            gate = self._gates[vchannel] = _Gate()
        gate.pending += 1
        try:
            async with gate.lock:
                if self._in_flight.get(vchannel):
                    gate.drained = asyncio.Event()
                    await gate.drained.wait()
                    gate.drained = None
                if self._abort is not None:
                    await self._abort(
                        vchannel, f"an exclusive {message.type.name} message on its vchannel"
                    )
                return await call_next(message)
        finally:
            gate.pending -= 1
            if not gate.pending:
                del self._gates[vchannel]
                gate.opened.set()


def _single(call_next: AppendBatchNext) -> AppendNext:
    async def append_one(message: Message) -> AppendResult:
        (result,) = await call_next((message,))
        return result

    return append_one
