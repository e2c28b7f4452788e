"""A client's appends on the node, started and answered.

The ``Append``s of one frame to one WAL (``Session.handle_frame`` finds the runs) start
as one group, ``start_group``: ``LocalWAL.submit_group`` makes each message an
independent append that joins the coalescer's batch (chain, tick) with no task or
coroutine of its own, and the group's one future answers every request from its
callback, one ``Appended`` or ``Failed`` each, in any order, by request id. A message
that cannot be converted fails alone; a read-only or unknown handle fails the whole run.
An ``AppendMany`` is one ``append_many``, answered with one ``Appended`` or ``Failed``.
A ``Recall`` (a reconnecting client's, before it sends its unanswered appends again) is
one ``LocalWAL.recall_keys``, answered with ``Recalled``.
Every group counts against the connection's requests in flight until its future is done.

This is the node's hot path: per message, the conversion from the wire, its charge and
its answer, and nothing else. The conversions are ``_wire``'s compiled ones: the
messages of a group or an ``AppendMany`` built in one call (``compiled_messages_of``,
``messages_of``), the answers encoded in one (``encode_appended_each``,
``encode_appended``) and sent as bytes.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, cast

from walsvc.core._message import Message
from walsvc.remote._protocol import Append, AppendMany, Recall, Recalled
from walsvc.write._coalesce import Outcome

from ._wire import (
    charge_of,
    compiled_messages_of,
    encode_appended,
    encode_appended_each,
    message_of,
    messages_of,
    wire_result,
)

if TYPE_CHECKING:
    from ._session import Session

__all__ = ("append_many", "recall", "start_group")


def start_group(session: Session, requests: list[Append]) -> None:
    """Start the appends of ``requests`` (to one WAL) as independent appends, with
    no task: the WAL's future for the group answers each from its callback."""
    try:
        wal = session.writable(requests[0].wal)
    except Exception as exc:
        for request in requests:
            session.fail(request.request, exc)
        return
    wires = [request.message for request in requests]
    messages: list[Message] | None = compiled_messages_of(wires)
    started: list[int]
    if messages is not None:  # every message valid (the common case)
        started = [request.request for request in requests]
        charge = charge_of(wires)
    else:
        messages, started, charge = [], [], 0
        for request in requests:
            try:
                messages.append(message_of(request.message))
            except Exception as exc:  # an invalid message fails alone
                session.fail(request.request, exc)
                continue
            started.append(request.request)
            charge += 64 + len(request.message.payload)
        if not messages:
            return
    appended = wal.submit_group(messages)
    session.in_flight.add(appended, charge, len(started))
    appended.add_done_callback(functools.partial(_answer_group, session, started))


def _answer_group(
    session: Session, requests: list[int], appended: asyncio.Future[list[Outcome]]
) -> None:
    """Answer each of ``requests`` with its outcome in the group's future."""
    if appended.cancelled():
        return  # the connection closed before its batch started: not in the log
    error = appended.exception()
    if error is not None:
        for request in requests:
            session.fail(request, error)
        return
    outcomes = appended.result()
    answers = encode_appended_each(requests, outcomes)  # an Appended's bytes, or None
    if None not in answers:
        session.send_encoded_many(cast("list[bytes]", answers))
        return
    for request, answer, outcome in zip(requests, answers, outcomes, strict=True):
        if answer is not None:
            session.send_encoded(answer)
        else:
            session.fail(request, cast(Exception, outcome))


async def append_many(session: Session, request: AppendMany) -> None:
    """Append ``request``'s messages with one ``append_many`` and answer it."""
    try:
        wal = session.writable(request.wal)
        results = await wal.append_many(messages_of(request.messages))
    except Exception as exc:
        session.fail(request.request, exc)
        return
    session.send_encoded(encode_appended(request.request, results))


async def recall(session: Session, request: Recall) -> None:
    """Tell what became of the appends of ``request``'s keys, and answer it."""
    try:
        wal = session.writable(request.wal)
        results = await wal.recall_keys(request.keys, request.since_tick)
    except Exception as exc:
        session.fail(request.request, exc)
        return
    session.send(
        Recalled(request.request, [None if r is None else wire_result(r) for r in results])
    )
