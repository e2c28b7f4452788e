"""The node's transactions: one table for the whole node, keyed by pchannel and txn id.

A client's ``begin_txn`` makes a transaction handle on the node's WAL (``LocalWAL.
begin_txn``: the node's interceptor chain owns its state, keepalive and expiry); the
table keeps that handle under its id, and the client names it by id in every later call.
The table belongs to no connection: closing a connection aborts none of its
transactions (one left alone expires by its keepalive, as a local one does), and the
same client, reconnected, takes one up again by id (``TxnResume``).

A client resends what was in flight when its connection dropped (protocol version 2):
a begin names itself with a ``token`` and every later call with its handle's ``caller``
and ``seq``, and the table answers a call it has served again, from the first call's
outcome, instead of applying it twice (it keeps the last ``_CALLS_KEPT`` calls of each
transaction and the last ``_KEPT`` begin tokens; a resend older than that is refused
with ``AppendOutcomeUnknown``, never applied).

A handle that ended (committed, rolled back, failed) stays in the table, bounded, so a
late or repeated call gets the error a local handle would raise rather than
``UnknownTxn``; so does one idle past its keepalive (its next call raises ``TxnExpired``,
from the interceptor). Past the bound the least recently used of those are forgotten.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, final

from walsvc.core._errors import AppendOutcomeUnknown, TxnError, TxnNotActive, UnknownTxn
from walsvc.core._message import AppendResult, Message
from walsvc.remote._protocol import (
    Appended,
    Done,
    TxnAppend,
    TxnBegin,
    TxnBegun,
    TxnCommit,
    TxnResume,
    TxnRollback,
    WireResult,
)
from walsvc.wal._wal import LocalWAL
from walsvc.write._txn import Txn, TxnState

from ._wire import messages_of, wire_result

__all__ = ("NodeTxns", "TxnRequest")

#: The requests ``NodeTxns.answer`` serves.
TxnRequest = TxnBegin | TxnResume | TxnAppend | TxnCommit | TxnRollback

#: How many transactions the table keeps before it forgets ended or idle ones (and how
#: many begin tokens it remembers).
_KEPT: Final = 16_384
#: How many calls of one transaction the table remembers the outcome of.
_CALLS_KEPT: Final = 256
#: A transaction call: TxnAppend, TxnCommit or TxnRollback.
_Call = TxnAppend | TxnCommit | TxnRollback
_T = TypeVar("_T")


@final
class _Entry:
    """A transaction handle, when a client last used it, and what ended it (if a call
    failed with a transaction error)."""

    __slots__ = ("calls", "ended_by", "forgotten", "touched", "txn")

    def __init__(self, txn: Txn, now: float) -> None:
        self.txn = txn
        self.touched = now
        self.ended_by: TxnError | None = None
        #: The outcome of each call served, by (caller, seq), oldest first.
        self.calls: dict[tuple[int, int], asyncio.Future[list[WireResult] | None]] = {}
        #: Per caller, the highest seq whose outcome was forgotten.
        self.forgotten: dict[int, int] = {}

    def remember(
        self, call: tuple[int, int], outcome: asyncio.Future[list[WireResult] | None]
    ) -> None:
        """Keep ``outcome`` as the answer of ``call``, forgetting the oldest past
        ``_CALLS_KEPT``."""
        calls = self.calls
        calls[call] = outcome
        while len(calls) > _CALLS_KEPT:
            (caller, seq) = next(iter(calls))
            del calls[(caller, seq)]
            self.forgotten[caller] = max(seq, self.forgotten.get(caller, 0))

    def idle(self, now: float) -> bool:
        """True once the handle ended, or went unused past its keepalive."""
        return (
            self.txn.state is not TxnState.OPEN
            or now - self.touched > self.txn.context.keepalive_ms / 1000
        )


@final
class NodeTxns:
    """The node's transaction handles by (pchannel, txn id) (see the module docstring).
    ``clock`` (monotonic seconds) decides idleness, only for forgetting."""

    __slots__ = ("_clock", "_entries", "_kept", "_tokens")

    def __init__(self, *, kept: int = _KEPT, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._kept = kept
        self._clock = clock
        #: The begins served, by (pchannel, token).
        self._tokens: OrderedDict[tuple[str, str], asyncio.Future[Txn]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def answer(self, wal: LocalWAL, request: TxnRequest) -> TxnBegun | Appended | Done:
        """Serve ``request`` on ``wal`` (the node's WAL of the client's writable handle);
        raises the error a local call raises."""
        if isinstance(request, TxnAppend | TxnCommit | TxnRollback):
            results = await self._call(wal, request)
            if results is None:
                return Done(request.request)
            return Appended(request.request, results)
        if isinstance(request, TxnBegin):
            txn = await self._begin_once(wal, request)
        else:
            txn = self.resume(wal, request.txn_id)
        replay = txn.replay
        return TxnBegun(
            request.request,
            txn.txn_id,
            txn.context.keepalive_ms,
            txn.vchannel,
            txn.idempotency_key,
            wire_result(txn.begin_result),
            None if replay is None else [wire_result(r) for r in replay.bodies],
            None if replay is None else wire_result(replay.commit),
        )

    async def _call(self, wal: LocalWAL, request: _Call) -> list[WireResult] | None:
        """Apply ``request``, or, if its (caller, seq) was served, its first outcome."""
        if request.caller is None or request.seq is None:
            return await self._apply(wal, request)
        entry = self._entry(wal, request.txn_id)
        call = (request.caller, request.seq)
        first = entry.calls.get(call)
        if first is None:
            if request.seq <= entry.forgotten.get(request.caller, 0):
                raise AppendOutcomeUnknown(
                    f"call {request.seq} of transaction {request.txn_id} was resent after"
                    f" the node forgot its outcome ({_CALLS_KEPT} later calls)"
                )
            first = _run_to_end(self._apply(wal, request))
            entry.remember(call, first)
        return await asyncio.shield(first)

    async def _apply(self, wal: LocalWAL, request: _Call) -> list[WireResult] | None:
        if isinstance(request, TxnAppend):
            messages = messages_of(request.messages)
            return [wire_result(r) for r in await self.append(wal, request.txn_id, messages)]
        if isinstance(request, TxnCommit):
            return [wire_result(await self.commit(wal, request.txn_id))]
        await self.rollback(wal, request.txn_id)
        return None

    async def _begin_once(self, wal: LocalWAL, request: TxnBegin) -> Txn:
        """``begin`` for ``request``, or, if its token was served, that begin's outcome."""
        begin = self.begin(wal, request.vchannel, request.keepalive, request.idempotency_key)
        if request.token is None:
            return await begin
        key = (wal.pchannel, request.token)
        first = self._tokens.get(key)
        if first is None:
            first = self._tokens[key] = _run_to_end(begin)
            while len(self._tokens) > self._kept:
                self._tokens.popitem(last=False)
        else:
            begin.close()  # not run: the first begin answers
            self._tokens.move_to_end(key)
        return await asyncio.shield(first)

    async def begin(
        self, wal: LocalWAL, vchannel: str, keepalive: float, idempotency_key: str | None
    ) -> Txn:
        """``wal.begin_txn(...)``; the handle is kept under its id."""
        txn = await wal.begin_txn(vchannel, keepalive=keepalive, idempotency_key=idempotency_key)
        self._entries[(wal.pchannel, txn.txn_id)] = _Entry(txn, self._clock())
        self._forget_idle()
        return txn

    def resume(self, wal: LocalWAL, txn_id: int) -> Txn:
        """The handle of transaction ``txn_id``; raises ``UnknownTxn`` if the node has
        none, and the error that ended it if a call ended it (``TxnNotActive`` once
        committed or rolled back)."""
        entry = self._entry(wal, txn_id)
        if entry.ended_by is not None:
            raise type(entry.ended_by)(str(entry.ended_by))
        if entry.txn.state is not TxnState.OPEN:
            raise TxnNotActive(f"transaction {txn_id} is {entry.txn.state.value}")
        return entry.txn

    async def append(
        self, wal: LocalWAL, txn_id: int, messages: list[Message]
    ) -> list[AppendResult]:
        """``Txn.append`` (one message) or ``Txn.append_many`` (more)."""
        entry = self._entry(wal, txn_id)
        try:
            if len(messages) == 1:
                return [await entry.txn.append(messages[0])]
            return await entry.txn.append_many(messages)
        except TxnError as exc:
            entry.ended_by = entry.ended_by or exc
            raise

    async def commit(self, wal: LocalWAL, txn_id: int) -> AppendResult:
        """``Txn.commit``."""
        entry = self._entry(wal, txn_id)
        try:
            return await entry.txn.commit()
        except TxnError as exc:
            entry.ended_by = entry.ended_by or exc
            raise

    async def rollback(self, wal: LocalWAL, txn_id: int) -> None:
        """``Txn.rollback``."""
        entry = self._entry(wal, txn_id)
        try:
            await entry.txn.rollback()
        except TxnError as exc:
            entry.ended_by = entry.ended_by or exc
            raise

    def _entry(self, wal: LocalWAL, txn_id: int) -> _Entry:
        key = (wal.pchannel, txn_id)
        entry = self._entries.get(key)
        if entry is None:
            raise UnknownTxn(f"transaction {txn_id} is not open on this node")
        entry.touched = self._clock()
        self._entries.move_to_end(key)
        return entry

    def _forget_idle(self) -> None:
        """Past the bound, forget the least recently used handles that ended or idled
        past their keepalive (open ones in use are kept, however many)."""
        entries = self._entries
        now = self._clock()
        while len(entries) > self._kept:
            key, entry = next(iter(entries.items()))
            if not entry.idle(now):
                return
            del entries[key]


def _run_to_end(work: Awaitable[_T]) -> asyncio.Future[_T]:
    """``work`` as a future that runs to its end whoever waits for it (its error is
    retrieved even if nobody does)."""
    future = asyncio.ensure_future(work)
    future.add_done_callback(_retrieve)
    return future


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
