"""Coalescing of concurrent appends: the messages appended within one event-loop
iteration go down the WAL's chain together.

This is group commit one layer above the backend's: the interceptor chain, the timetick
allocation, the shared parts of the envelope and the backend call are paid once per batch
instead of once per message, and each producer pays only for a future. A lone producer
waits one extra loop iteration; 64 concurrent producers share one batch.

Two kinds, one per kind of message. ``AppendCoalescer`` takes plain messages down the
batch chain. ``KeyedCoalescer`` takes keyed ones to the chain's ``CoalescingInterceptor``
(``Dedup``: it claims their keys, appends the new ones as one batch and settles each key
from its result), which answers each message on its own. Batches of one kind reach the
serialization point in submission order. Nothing orders a plain and a keyed append in
flight at the same time (one started while the other waits for its batch may land before
it); an append that has returned is before every append started after it.

Each producer gets its own answer: the batch's result, or its error. A plain batch
refused before anything was written because one message is too large is re-run one
message at a time, so only that message fails. A producer cancelled before its batch
starts is left out of the batch, so its message is not appended; once the batch started,
it runs to its end whatever becomes of its producers.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar, cast, final

from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.core._errors import AppendOutcomeUnknown, MessageTooLarge
from walsvc.core._message import AppendResult, Message

__all__ = ("AppendCoalescer", "KeyedCoalescer")

_R = TypeVar("_R")
#: What ``KeyedCoalescer`` hands its batches to (a ``CoalescingInterceptor`` over the
#: rest of the chain): one outcome per message.
AppendEach = Callable[[Sequence[Message]], Awaitable[Sequence[AppendResult | Exception | None]]]


class _Coalescer(Generic[_R]):
    """The gathering both kinds share: ``submit`` queues a message and its future; the
    first submit of a loop iteration starts the task that takes the batch."""

    __slots__ = ("_futures", "_loop", "_messages", "_running")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # The batch being gathered: message i is answered through future i.
        self._messages: list[Message] = []
        self._futures: list[asyncio.Future[_R]] = []
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, message: Message) -> asyncio.Future[_R]:
        """Queue ``message`` for the batch of this loop iteration; the future gets its
        answer once the batch is appended."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[_R] = loop.create_future()
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

    def _take(self) -> tuple[list[Message], list[asyncio.Future[_R]]]:
        """The queued batch, without the messages of cancelled producers."""
        messages, futures = self._messages, self._futures
        self._messages, self._futures = [], []
        if any(map(_cancelled, futures)):
            kept = [(m, f) for m, f in zip(messages, futures, strict=True) if not f.cancelled()]
            messages, futures = [m for m, _ in kept], [f for _, f in kept]
        return messages, futures

    async def _append_queued(self) -> None:
        raise NotImplementedError

    async def drain(self) -> None:
        """Wait until every batch, the queued one included, has been appended (or
        failed): what the WAL does before it closes."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


@final
class AppendCoalescer(_Coalescer[AppendResult]):
    """Gathers the plain messages ``submit``ted within one loop iteration into one batch
    for ``append_batch``; ``append_one`` appends a batch of one, and the messages of a
    batch that one of them made too large to write, one by one and in order. A future
    gets its message's result or error."""

    __slots__ = ("_append_batch", "_append_one")

    def __init__(self, append_batch: AppendBatchNext, append_one: AppendNext) -> None:
        super().__init__()
        self._append_batch = append_batch
        self._append_one = append_one

    async def _append_queued(self) -> None:
        """Append the queued messages as one batch, leaving out cancelled producers."""
        messages, futures = self._take()
        if not messages:
            return
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


@final
class KeyedCoalescer(_Coalescer[AppendResult | None]):
    """Gathers the keyed messages ``submit``ted within one loop iteration into one batch
    for ``append_each`` (the chain's ``CoalescingInterceptor``), which answers each
    message on its own. A future gets its message's result, its error, or None: the
    producer then appends the message on its own, through the chain."""

    __slots__ = ("_append_each",)

    def __init__(self, append_each: AppendEach) -> None:
        super().__init__()
        self._append_each = append_each

    async def _append_queued(self) -> None:
        """Hand the queued messages to ``append_each``, leaving out cancelled producers."""
        messages, futures = self._take()
        if not messages:
            return
        try:
            outcomes = await self._append_each(messages)
        except BaseException as exc:
            _fail(futures, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if len(outcomes) != len(futures):
            _fail(
                futures,
                AppendOutcomeUnknown(
                    f"the interceptor chain answered {len(outcomes)} of a batch of"
                    f" {len(futures)} appends; they may or may not be in the log"
                ),
            )
            return
        if set(map(type, outcomes)) == _RESULTS_ONLY and not any(map(_done, futures)):
            results = cast(Sequence[AppendResult | None], outcomes)
            _consume(map(_set_result, futures, results))  # the usual batch, in C loops
            return
        for future, outcome in zip(futures, outcomes, strict=True):
            if future.done():  # its producer was cancelled while the batch ran
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


#: The types of the outcomes of a batch whose every message has its result.
_RESULTS_ONLY = frozenset({AppendResult})
_cancelled = asyncio.Future.cancelled
_done = asyncio.Future.done
_set_result = asyncio.Future.set_result
#: Runs an iterator to its end, keeping nothing.
_consume = collections.deque[object](maxlen=0).extend


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
