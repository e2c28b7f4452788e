"""A writer's start: its interceptors' ``ready`` hooks, run once in the background.

A read-write WAL serves no append until every ``ReadyInterceptor`` of its chain has
recovered what it keeps (Dedup's window, the open transactions, ...), but its open does
not wait for them: ``WriterStartup`` runs them as a task, and each append waits for it
once (``wait``). While the hooks run, new messages carry the last-confirmed id of the
newest message in the log (a pin on the serialization point), so that a transaction an
earlier writer left open stays visible from every checkpoint written meanwhile. A start
that failed fails every later append with a fresh error of the failure's type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final, final

from walsvc.backends._base import Backend
from walsvc.core._chain import InterceptorContext, ReadyInterceptor
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALClosed, WALError, WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId

__all__ = ("WriterStartup",)

#: The last-confirmed pin held while the ready hooks run.
_RECOVERY: Final = object()


@final
class WriterStartup:
    """The ready hooks of ``members``, started at once as a task on the running loop.
    ``pins`` is the serialization point's last-confirmed pins (``_RECOVERY`` is held
    there until the hooks finish); ``context`` is what the hooks see of the WAL."""

    __slots__ = ("_error", "_pchannel", "_task")

    def __init__(
        self,
        backend: Backend,
        pins: dict[object, MessageId | None],
        context: InterceptorContext,
        members: Sequence[ReadyInterceptor],
    ) -> None:
        self._pchannel = backend.pchannel
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            _run(backend, pins, context, members)
        )

    async def wait(self) -> None:
        """Return once every hook has finished; raise (a fresh ``WALError`` of the
        failure's type each time, its cause the failure) if one failed or the start was
        cancelled by ``cancel``."""
        task = self._task
        if task is not None:
            if not task.done():
                await asyncio.wait((task,))  # its outcome is raised below, once for all
            self._task = None
            if task.cancelled():  # only cancel() cancels it
                self._error = WALClosed(f"WAL {self._pchannel!r} closed while starting")
            else:
                self._error = task.exception()
        error = self._error
        if error is not None:
            # A fresh error each time (one raised twice would pile up tracebacks), of the
            # type that failed the start: fenced before the first TimeTick, damage, ...
            raise _start_failed(self._pchannel, error) from error

    async def cancel(self) -> None:
        """Stop the hooks if they still run, and collect the task's outcome (a failure
        no append waited for is retrieved here, not leaked)."""
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _run(
    backend: Backend,
    pins: dict[object, MessageId | None],
    context: InterceptorContext,
    members: Sequence[ReadyInterceptor],
) -> None:
    await _hold_recovered_checkpoint(backend, pins)
    for member in members:
        await member.ready(context)
    pins.pop(_RECOVERY, None)


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
    """What every append raises once the ready hooks failed with ``error``: a WALError
    of its type (``WALError`` itself for anything else)."""
    message = f"WAL {pchannel!r} could not start its writer: {error}"
    if isinstance(error, WALError):
        return type(error)(message)
    return WALError(f"WAL {pchannel!r} could not start its writer: {error!r}")
