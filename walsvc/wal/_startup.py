"""A writer's start: its interceptors' ``ready`` hooks, run in the background.

A read-write WAL serves no append until every ``ReadyInterceptor`` of its chain has
recovered what it keeps (Dedup's window, the open transactions, ...), but its open does
not wait for them: ``WriterStartup`` runs them as a task, and each append waits for it
once (``wait``). While the hooks run, new messages carry the last-confirmed id of the
newest message in the log (a pin on the serialization point), so that a transaction an
earlier writer left open stays visible from every checkpoint written meanwhile. A start
that failed transiently (the backend was away) is tried again by the next append; one
that failed otherwise fails every later append with a fresh error of the failure's type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final, final

from walsvc.backends._base import Backend
from walsvc.core._chain import InterceptorContext, ReadyInterceptor
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    BackendUnavailable,
    WALClosed,
    WALError,
    WALTruncated,
    transient,
)
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId

__all__ = ("WriterStartup",)

#: The last-confirmed pin held while the ready hooks run.
_RECOVERY: Final = object()


@final
class WriterStartup:
    """The ready hooks of ``members``, started at once as a task on the running loop.
    ``pins`` is the serialization point's last-confirmed pins (``_RECOVERY`` is held
    there until the hooks finish); ``context`` is what the hooks see of the WAL.

    A start that failed transiently (a retriable error, or an append of a hook whose
    outcome is unknown: the backend was unreachable for a while) is started again by the
    next ``wait``, from the hook that failed: a WAL whose broker was away while it opened
    serves appends once the broker is back. Any other failure is final."""

    __slots__ = (
        "_backend",
        "_context",
        "_done",
        "_error",
        "_members",
        "_pinned",
        "_pins",
        "_task",
    )

    def __init__(
        self,
        backend: Backend,
        pins: dict[object, MessageId | None],
        context: InterceptorContext,
        members: Sequence[ReadyInterceptor],
    ) -> None:
        self._backend = backend
        self._pins = pins
        self._context = context
        self._members = tuple(members)
        #: Whether the recovered checkpoint is pinned, and how many of ``members``
        #: finished their hook: a restart goes on from there.
        self._pinned = False
        self._done = 0
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = self._begin()

    def _begin(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        if not self._pinned:
            await _hold_recovered_checkpoint(self._backend, self._pins)
            self._pinned = True
        members = self._members
        while self._done < len(members):
            await members[self._done].ready(self._context)
            self._done += 1
        self._pins.pop(_RECOVERY, None)

    async def wait(self) -> None:
        """Return once every hook has finished. Raise a fresh ``WALError`` each time
        (its cause the failure) if the start failed: ``BackendUnavailable`` after a
        transient failure (this call wrote nothing; the next one starts the hooks
        again), else one of the failure's type (``WALClosed`` if ``cancel`` stopped it)."""
        if self._task is None and transient(self._error):
            self._error = None
            self._task = self._begin()
        task = self._task
        if task is None:
            error = self._error
        else:
            if not task.done():
                await asyncio.wait((task,))  # its outcome is raised below, once for all
            # only cancel() cancels it
            error = (
                WALClosed(f"WAL {self._backend.pchannel!r} closed while starting")
                if task.cancelled()
                else task.exception()
            )
            if self._task is task:  # not yet collected by another waiter
                self._task = None
                self._error = error
        if error is not None:
            # A fresh error each time (one raised twice would pile up tracebacks), of the
            # type that failed the start: fenced before the first TimeTick, damage, ...
            raise _start_failed(self._backend.pchannel, error) from error

    async def cancel(self) -> None:
        """Stop the hooks if they still run, and collect the task's outcome (a failure
        no append waited for is retrieved here, not leaked); no later ``wait`` starts
        them again."""
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif transient(self._error):
            self._error = WALClosed(f"WAL {self._backend.pchannel!r} closed while starting")


async def _hold_recovered_checkpoint(
    backend: Backend, pins: dict[object, MessageId | None]
) -> None:
    """Pin the last-confirmed id of the newest message in the log, if any."""
    latest = await backend.latest_message_id()
    if latest is None:
        return
    scanner = backend.read(DeliverPolicy.start_from(latest), Filter.everything())
    try:
        (newest, *_) = await scanner.next_batch()
    except WALTruncated:
        return  # nothing retained: nothing left open
    finally:
        await scanner.aclose()
    pins[_RECOVERY] = newest.last_confirmed_id


def _start_failed(pchannel: str, error: BaseException) -> WALError:
    """What an append raises after the ready hooks failed with ``error``:
    ``BackendUnavailable`` if the failure was transient (the append wrote nothing and
    may be retried), else a WALError of its type (``WALError`` itself for anything
    else)."""
    if transient(error):
        return BackendUnavailable(f"WAL {pchannel!r} could not start its writer yet: {error}")
    message = f"WAL {pchannel!r} could not start its writer: {error}"
    if isinstance(error, WALError):
        return type(error)(message)
    return WALError(f"WAL {pchannel!r} could not start its writer: {error!r}")
