"""Exclusive (DDL) messages: CreateCollection, DropCollection, CreatePartition,
DropPartition and ManualFlush serialize per vchannel.

An exclusive message on vchannel V waits until every append on V that started before it
finished, holds back appends on V that start after it, rolls back V's open transactions
(their RollbackTxns land before it), and only then is appended. Appends on other
vchannels are not affected.

The broadcast vchannel "" reaches every vchannel, and the lock treats it so: a broadcast
append counts as an append on every vchannel (a DDL on V waits for it, and holds it back),
and a broadcast DDL is exclusive against everything: it waits for the DDLs already
running and for every append in flight, holds back all appends and DDLs that start after
it, and rolls back every open transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from operator import attrgetter
from typing import final

from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.core._message import EXCLUSIVE_TYPES, AppendResult, Message

__all__ = ("ExclusiveLock",)

#: Rolls back the open transactions of a vchannel ("" for all), with a reason.
AbortVchannel = Callable[[str, str], Awaitable[None]]
_BROADCAST = ""
# Batch passes iterate in C (map), not in a comprehension: no bytecode per message.
_type_of = attrgetter("type")
_vchannel_of = attrgetter("vchannel")


@final
class _Gate:
    """One vchannel's exclusive section: closed while an exclusive message is pending."""

    __slots__ = ("lock", "pending")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # exclusive messages of the vchannel, one at a time
        self.pending = 0  # exclusive messages waiting or running


@final
class ExclusiveLock:
    """Serializes exclusive messages per vchannel and fails the vchannel's open
    transactions through ``abort_transactions`` (the default chain wires it to
    ``Transactions.abort_vchannel``)."""

    __slots__ = ("_abort", "_batches", "_gates", "_in_flight", "_waiters")

    def __init__(self, abort_transactions: AbortVchannel | None = None) -> None:
        self._abort = abort_transactions
        self._in_flight: dict[str, int] = {}  # single appends past the gates, per vchannel
        # Batches past the gates, each under a token of its own: recorded once, not once
        # per vchannel (a DDL, which is rare, looks through them; a batch, which is
        # common, costs two dict operations).
        self._batches: dict[object, Sequence[Message]] = {}
        self._gates: dict[str, _Gate] = {}  # vchannels with exclusive messages pending
        self._waiters: list[asyncio.Future[None]] = []  # woken when either changes

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        """Exclusive messages take their vchannel's gate; others pass it (or wait)."""
        if message.type in EXCLUSIVE_TYPES:
            return await self._exclusive(message, call_next)
        vchannel = message.vchannel
        if self._gates and self._held(vchannel):
            await self._wait_until(lambda: not self._held(vchannel))
        in_flight = self._in_flight
        in_flight[vchannel] = in_flight.get(vchannel, 0) + 1
        try:
            return await call_next(message)
        finally:
            self._leave(vchannel)

    def admit_plain(self, message: Message) -> bool:
        """``do_append`` without a coroutine (``walsvc.PlainAdmission``) for a message
        that is not exclusive and whose vchannel no exclusive message holds back: count
        it in flight. False for any other message."""
        if message.type in EXCLUSIVE_TYPES:
            return False
        vchannel = message.vchannel
        if self._gates and self._held(vchannel):
            return False
        in_flight = self._in_flight
        in_flight[vchannel] = in_flight.get(vchannel, 0) + 1
        return True

    def release_plain(self, message: Message) -> None:
        """An append ``admit_plain`` took has finished."""
        self._leave(message.vchannel)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        """A batch with an exclusive message goes one message at a time; any other batch
        passes the gates of all its vchannels at once."""
        if not EXCLUSIVE_TYPES.isdisjoint(map(_type_of, messages)):
            one = _single(call_next)
            return [await self.do_append(message, one) for message in messages]
        if self._gates:
            vchannels = set(map(_vchannel_of, messages))
            if any(self._held(v) for v in vchannels):
                await self._wait_until(lambda: not any(self._held(v) for v in vchannels))
        token = object()
        self._batches[token] = messages
        try:
            return await call_next(messages)
        finally:
            del self._batches[token]
            if self._waiters:
                self._wake()

    def _held(self, vchannel: str) -> bool:
        """True while a pending exclusive message holds back appends on ``vchannel``."""
        gates = self._gates
        return bool(gates) and (vchannel == _BROADCAST or vchannel in gates or _BROADCAST in gates)

    def _must_wait_for(self, vchannel: str) -> bool:
        """True while appends an exclusive message on ``vchannel`` waits for are in
        flight (and, for a broadcast one, while other exclusive messages run)."""
        if vchannel == _BROADCAST:
            return bool(self._in_flight) or bool(self._batches) or len(self._gates) > 1
        if vchannel in self._in_flight or _BROADCAST in self._in_flight:
            return True
        reached = {vchannel, _BROADCAST}
        return any(
            not reached.isdisjoint(map(_vchannel_of, batch)) for batch in self._batches.values()
        )

    def _leave(self, vchannel: str) -> None:
        """An append on ``vchannel`` finished; the last one may let a DDL go."""
        count = self._in_flight[vchannel] - 1
        if count:
            self._in_flight[vchannel] = count
            return
        del self._in_flight[vchannel]
        if self._waiters:
            self._wake()

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _exclusive(self, message: Message, call_next: AppendNext) -> AppendResult:
        vchannel = message.vchannel
        if vchannel != _BROADCAST and _BROADCAST in self._gates:
            await self._wait_until(lambda: _BROADCAST not in self._gates)
        gate = self._gates.get(vchannel)
        if gate is None:
            gate = self._gates[vchannel] = _Gate()
        gate.pending += 1
        try:
            async with gate.lock:
                await self._wait_until(lambda: not self._must_wait_for(vchannel))
                if self._abort is not None:
                    where = "its vchannel" if vchannel else "the broadcast vchannel"
                    await self._abort(vchannel, f"an exclusive {message.type.name} on {where}")
                return await call_next(message)
        finally:
            gate.pending -= 1
            if not gate.pending:
                del self._gates[vchannel]
                self._wake()


def _single(call_next: AppendBatchNext) -> AppendNext:
    async def append_one(message: Message) -> AppendResult:
        (result,) = await call_next((message,))
        return result

    return append_one
