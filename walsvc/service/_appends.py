"""A client's appends on the node, started and answered.

The ``Append``s of one frame to one WAL (``Session.handle_frame`` finds the runs) start
as one group, ``start_group``: ``LocalWAL.submit_group`` makes each message an
independent append that joins the coalescer's batch (chain, tick) with no task or
coroutine of its own, and the group's one future answers every request from its
callback, one ``Appended`` or ``Failed`` each, in any order, by request id. A message
that cannot be converted fails alone; a read-only or unknown handle fails the whole run.
An ``AppendMany`` is one ``append_many``, answered with one ``Appended`` or ``Failed``.
Every group counts against the connection's requests in flight until its future is done.

This is the node's hot path: per message, the conversion from the wire, its charge and
its answer, and nothing else.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, cast

from walsvc.core._message import AppendResult, Message
from walsvc.remote._protocol import Append, Appended, AppendMany
from walsvc.write._coalesce import Outcome

from ._wire import message_of, wire_result

if TYPE_CHECKING:
    from ._session import Session

__all__ = ("append_many", "start_group")


def start_group(session: Session, requests: list[Append]) -> None:
    """Start the appends of ``requests`` (to one WAL) as independent appends, with
    no task: the WAL's future for the group answers each from its callback."""
    try:
        wal = session.writable(requests[0].wal)
    except Exception as exc:
        for request in requests:
            session.fail(request.request, exc)
        return
    messages: list[Message] = []
    started: list[int] = []
    charge = 0
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
    send, fail = session.send, session.fail
    for request, outcome in zip(requests, appended.result(), strict=True):
        if type(outcome) is AppendResult:
            send(Appended(request, [wire_result(outcome)]))
        else:
            fail(request, cast(Exception, outcome))


async def append_many(session: Session, request: AppendMany) -> None:
    """Append ``request``'s messages with one ``append_many`` and answer it."""
    try:
        wal = session.writable(request.wal)
        results = await wal.append_many([message_of(m) for m in request.messages])
    except Exception as exc:
        session.fail(request.request, exc)
        return
    session.send(Appended(request.request, [wire_result(r) for r in results]))
