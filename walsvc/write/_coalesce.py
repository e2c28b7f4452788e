"""Coalescing of concurrent appends: the plain messages appended within one event-loop
iteration go down the WAL's batch chain together.

This is group commit one layer above the backend's: the interceptor chain, the timetick
allocation, the shared parts of the envelope and the backend call are paid once per batch
instead of once per message, and each producer pays only for a future. A lone producer
waits one extra loop iteration; 64 concurrent producers share one batch.

Batches reach the serialization point in submission order. Keyed and transactional
appends take the chain directly, so one started while plain appends wait for their batch
may land before them (nothing orders appends that are in flight at the same time; one
that has returned is before every append started after it).

Each producer gets its own answer: the batch's results, or its error. A batch refused
before anything was written because one message is too large is re-run one message at a
time, so only that message fails. A producer cancelled before its batch starts is left
out of the batch, so its message is not appended.
"""

from __future__ import annotations

import asyncio
import collections
from typing import final

from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.core._errors import AppendOutcomeUnknown, MessageTooLarge
from walsvc.core._message import AppendResult, Message

__all__ = ("AppendCoalescer",)


@final
class AppendCoalescer:
    """Gathers the messages ``submit``ted within one loop iteration into one batch for
    ``append_batch``; ``append_one`` appends a batch of one, and the messages of a batch
    that one of them made too large to write, one by one and in order."""

    __slots__ = ("_append_batch", "_append_one", "_futures", "_loop", "_messages", "_running")

    def __init__(self, append_batch: AppendBatchNext, append_one: AppendNext) -> None:
        self._append_batch = append_batch
        self._append_one = append_one
        self._loop: asyncio.AbstractEventLoop | None = None
        # The batch being gathered: message i is answered through future i.
        self._messages: list[Message] = []
        self._futures: list[asyncio.Future[AppendResult]] = []
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, message: Message) -> asyncio.Future[AppendResult]:
        """Queue ``message`` for the batch of this loop iteration; the future gets its
        result (or error) once the batch is appended."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[AppendResult] = loop.create_future()
        self._futures.append(future)
        self._messages.append(message)
        if len(self._messages) == 1:
            # The task's first step runs after the callbacks already ready (the other
            # producers woken with this one), and takes everything queued by then. Tasks
            # start in the order they are created, so batches reach the serialization
            # point in submission order.
            task = loop.create_task(self._append_queued())
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return future

    async def _append_queued(self) -> None:
        """Append the queued messages as one batch, leaving out cancelled producers."""
        messages, futures = self._messages, self._futures
        self._messages, self._futures = [], []
        if any(map(_cancelled, futures)):
            kept = [(m, f) for m, f in zip(messages, futures, strict=True) if not f.cancelled()]
            if not kept:
                return
            messages, futures = [m for m, _ in kept], [f for _, f in kept]
        try:
            if len(messages) == 1:
                results = [await self._append_one(messages[0])]
            else:
                results = await self._append_batch(messages)
        except MessageTooLarge as exc:
            if len(messages) == 1:
                _fail(futures, exc)
            else:
                await self._one_by_one(messages, futures)
            return
        except BaseException as exc:
            _fail(futures, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if len(results) != len(futures):
            _fail(
                futures,
                AppendOutcomeUnknown(
                    f"the interceptor chain returned {len(results)} results for a batch of"
                    f" {len(futures)} appends; they may or may not be in the log"
                ),
            )
        elif any(map(_done, futures)):  # a producer was cancelled while its batch ran
            for future, result in zip(futures, results, strict=True):
                if not future.done():
                    future.set_result(result)
        else:  # the usual batch: resolved without a bytecode per producer
            _consume(map(_set_result, futures, results))

    async def _one_by_one(
        self, messages: list[Message], futures: list[asyncio.Future[AppendResult]]
    ) -> None:
        # Started in order, so they are serialized in order; each gets its own answer.
        appends = [asyncio.ensure_future(self._append_one(message)) for message in messages]
        await asyncio.wait(appends)
        for future, append in zip(futures, appends, strict=True):
            if future.done():
                continue
            exc = append.exception()
            if exc is None:
                future.set_result(append.result())
            else:
                future.set_exception(exc)

    async def drain(self) -> None:
        """Wait until every batch, the queued one included, has been appended (or
        failed): what the WAL does before it closes."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


_cancelled = asyncio.Future.cancelled
_done = asyncio.Future.done
_set_result = asyncio.Future.set_result
#: Runs an iterator to its end, keeping nothing.
_consume = collections.deque[object](maxlen=0).extend


def _fail(futures: list[asyncio.Future[AppendResult]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
