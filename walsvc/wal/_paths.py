"""The paths an append takes down one writer's interceptor chain, and which one it takes.

``AppendPaths`` holds a writer's chain in its four forms, each ending at the
serialization point: for one message or a batch, through every member or only through
those that see plain messages (a member that declares it passes plain messages on is left
out: ``PassesPlainMessages``). It also holds the two coalescers and the members that
admit a plain message at once (``PlainAdmission``), and chooses:

- a plain message (no key, no txn) joins the coalescer's batch where there is one (a
  backend whose acknowledgements take time); else, if every member of the plain chain
  admits it at once, it goes straight to the serialization point (without an ``await`` on
  a backend durable when it appends); else down the plain chain;
- a keyed message joins the keyed coalescer's batch (the outermost member takes
  concurrent ones together: ``CoalescingInterceptor``), else goes down the chain;
- a batch goes down the batch chain where every member handles batches;
- a group (``submit_group``: the node's appends of one frame) joins its coalescer's
  batch if it is all plain or all keyed; plain on a backend durable when it appends, each
  message is appended at once; else each goes on its own.

Nothing here checks a caller's message or the writer's state: ``LocalWAL`` does, and
says whether the writer is ready (writable, its interceptors started) where it matters.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import final

from walsvc.core._chain import (
    KEYED_BATCH,
    PLAIN_BATCH,
    AppendBatchNext,
    AppendNext,
    ChainMember,
    CoalescingInterceptor,
    PlainAdmission,
    build_batch_chain,
    build_chain,
    coalescing_head,
    plain_admitters,
    user_batch_kind,
)
from walsvc.core._message import SYSTEM_TYPES, AppendResult, Message
from walsvc.write._coalesce import AppendCoalescer, AppendEach, KeyedCoalescer, Outcome, outcome_of
from walsvc.write._serialization import SerializationPoint

__all__ = ("AppendPaths", "admit")

#: Appends one message on its own, as ``LocalWAL.append`` would, from a future.
SubmitAlone = Callable[[Message], "asyncio.Future[AppendResult]"]


@final
class AppendPaths:
    """The chain of ``members`` over ``point`` in its forms, its coalescers and its plain
    admission (see the module docstring). ``immediate_acks``: the backend's appends are
    durable when made."""

    __slots__ = (
        "admitters",
        "batch_chain",
        "chain",
        "coalescer",
        "immediate_acks",
        "keyed_coalescer",
        "plain_batch_chain",
        "plain_chain",
        "point",
    )

    def __init__(
        self, members: Sequence[ChainMember], point: SerializationPoint, immediate_acks: bool
    ) -> None:
        self.point = point
        self.immediate_acks = immediate_acks
        self.chain: AppendNext = build_chain(members, point.serialize)
        #: None where a member has no batch handler (batches go one message at a time).
        self.batch_chain = build_batch_chain(members, point.serialize_batch)
        self.plain_chain = build_chain(members, point.serialize, plain=True)
        self.plain_batch_chain = build_batch_chain(members, point.serialize_batch, plain=True)
        #: The plain chain's members, if every one admits plain messages at once (a plain
        #: message then skips the chain: no coroutine per member); else None.
        self.admitters = plain_admitters(members)
        # Concurrent plain appends share one pass down the batch chain when every member
        # handles batches and the backend's acks take time (else there is no concurrency
        # to exploit, and a batch would only add a loop iteration to each append).
        self.coalescer = (
            AppendCoalescer(self.plain_batch_chain, self.plain_chain)
            if self.plain_batch_chain is not None and not immediate_acks
            else None
        )
        # Concurrent keyed appends likewise, through the chain's outermost interceptor
        # when it takes them together (Dedup, see CoalescingInterceptor); on every
        # backend, since a keyed append alone runs as a task of its own anyway.
        head = coalescing_head(members, point.serialize_batch)
        self.keyed_coalescer = None if head is None else KeyedCoalescer(_each(*head), self.chain)

    def append_admitted_now(self, message: Message) -> AppendResult:
        """Append plain ``message``, which every member of the plain chain admitted, at
        the serialization point of a backend durable when it appends; release it."""
        admitters = self.admitters
        assert admitters is not None
        try:
            return self.point.serialize_now(message)
        finally:
            for member in admitters:
                member.release_plain(message)

    def submit(self, message: Message) -> asyncio.Future[AppendResult] | None:
        """``message``'s place in its coalescer's batch (the future gets what ``append``
        would return or raise), if it is a user message a coalescer takes; else None.
        The writer must be ready."""
        if type(message) is not Message or message.txn is not None or message.type in SYSTEM_TYPES:
            return None
        if message.idempotency_key is None:
            return None if self.coalescer is None else self.coalescer.submit(message)
        return None if self.keyed_coalescer is None else self.keyed_coalescer.submit(message)

    def submit_group(
        self, messages: Sequence[Message], ready: bool, alone: SubmitAlone
    ) -> asyncio.Future[list[Outcome]]:
        """``LocalWAL.submit_group``: the future of the outcomes of ``messages``, each
        appended as ``append`` would. ``ready``: the writer is writable and its
        interceptors started (else every message goes ``alone``)."""
        if not messages:
            done: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        kind = user_batch_kind(list(messages)) if ready else None
        coalescer = (
            self.coalescer
            if kind == PLAIN_BATCH
            else self.keyed_coalescer
            if kind == KEYED_BATCH
            else None
        )
        if coalescer is not None:
            return coalescer.submit_group(messages)
        if kind == PLAIN_BATCH and self.admitters is not None and self.immediate_acks:
            return self._append_plain_now(messages, alone)
        return asyncio.ensure_future(_append_each_alone(messages, alone))

    def _append_plain_now(
        self, messages: Sequence[Message], alone: SubmitAlone
    ) -> asyncio.Future[list[Outcome]]:
        """A group of plain messages on a backend durable when it appends, whose plain
        chain admits at once: each appended now, in order, its outcome what ``append``
        would return or raise. Those from the first the chain does not admit at once go
        ``alone``."""
        admitters = self.admitters
        assert admitters is not None
        outcomes: list[Outcome] = []
        for message in messages:
            if not admit(admitters, message):
                break
            try:
                outcomes.append(self.append_admitted_now(message))
            except Exception as exc:  # the error append raises: this message's outcome
                outcomes.append(exc)
        if len(outcomes) < len(messages):
            rest = _append_each_alone(messages[len(outcomes) :], alone)
            return asyncio.ensure_future(_after(outcomes, rest))
        done: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        done.set_result(outcomes)
        return done


async def _append_each_alone(messages: Sequence[Message], alone: SubmitAlone) -> list[Outcome]:
    """The outcomes of ``messages``, each appended on its own."""
    appends = [alone(message) for message in messages]
    await asyncio.wait(appends)
    return [outcome_of(append) for append in appends]


async def _after(outcomes: list[Outcome], rest: Awaitable[list[Outcome]]) -> list[Outcome]:
    """``outcomes`` followed by those of ``rest``."""
    return outcomes + await rest


def _each(head: CoalescingInterceptor, below: AppendBatchNext) -> AppendEach:
    """``head.do_append_coalesced`` over the batch chain ``below`` it."""

    def append_each(
        messages: Sequence[Message],
    ) -> Awaitable[Sequence[AppendResult | Exception | None]]:
        return head.do_append_coalesced(messages, below)

    return append_each


def admit(admitters: tuple[PlainAdmission, ...], message: Message) -> bool:
    """Whether every one of ``admitters`` took ``message`` (``PlainAdmission``); if one
    refuses, those that took it release it."""
    for taken, member in enumerate(admitters):
        if not member.admit_plain(message):
            for admitted in admitters[:taken]:
                admitted.release_plain(message)
            return False
    return True
