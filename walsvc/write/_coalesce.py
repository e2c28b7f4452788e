"""Coalescing of concurrent appends: the messages appended within one event-loop
iteration go down the WAL's chain together.

This is group commit one layer above the backend's: the interceptor chain, the timetick
allocation, the shared parts of the envelope and the backend call are paid once per batch
instead of once per message, and each producer pays only for a future. A lone producer
waits one extra loop iteration; 64 concurrent producers share one batch.

Two kinds, one per kind of message. ``AppendCoalescer`` takes plain messages down the
batch chain. ``KeyedCoalescer`` takes keyed ones to the chain's ``CoalescingInterceptor``
(``Dedup``: it claims their keys, appends the new ones as one batch and settles each key
from its result), which answers each message on its own, or leaves it to be appended
alone down the chain (a key in flight elsewhere). Batches of one kind reach the
serialization point in submission order. Nothing orders a plain and a keyed append in
flight at the same time (one started while the other waits for its batch may land before
it); an append that has returned is before every append started after it.

Each producer gets its own answer: the batch's result, or its error. A caller that
starts many appends at once (the node, for the appends of one frame) submits them as a
group: they join the batch as if submitted one by one, and one future answers them all
with the list of their outcomes. A plain batch
refused before anything was written because one message is too large is re-run one
message at a time, so only that message fails. A producer cancelled before its batch
starts is left out of the batch, so its message is not appended; once the batch started,
it runs to its end whatever becomes of its producers.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from itertools import repeat
from typing import Any, cast, final

from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.core._errors import AppendOutcomeUnknown, MessageTooLarge
from walsvc.core._message import AppendResult, Message
from walsvc.core._metrics import WALMetrics

__all__ = ("AppendCoalescer", "KeyedCoalescer", "Outcome", "outcome_of")

#: What ``KeyedCoalescer`` hands its batches to (a ``CoalescingInterceptor`` over the
#: rest of the chain): one outcome per message.
AppendEach = Callable[[Sequence[Message]], Awaitable[Sequence[AppendResult | Exception | None]]]
#: One message's outcome in a group's answer: its result or the error it raised.
Outcome = AppendResult | Exception


class _Coalescer:
    """The gathering both kinds share: ``submit`` queues a message and its future,
    ``submit_group`` messages and one future; the first submit of a loop iteration
    starts the task that takes the batch."""

    __slots__ = ("_futures", "_groups", "_loop", "_messages", "_running", "metrics")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Where each batch's time to append is counted, once per message (None: not
        #: counted).
        self.metrics: WALMetrics | None = None
        # The batch being gathered: message i is answered through future i (a group's
        # future stands for each of its messages).
        self._messages: list[Message] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._groups: set[asyncio.Future[Any]] = set()  # the group futures among them
        # The tasks appending (batches, and messages appended alone).
        self._running: set[asyncio.Future[Any]] = set()

    def submit(self, message: Message) -> asyncio.Future[AppendResult]:
        """Queue ``message`` for the batch of this loop iteration; the future gets its
        answer once the batch is appended."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[AppendResult] = loop.create_future()
        self._futures.append(future)
        self._messages.append(message)
        if len(self._messages) == 1:
            self._start(loop)
        return future

    def submit_group(self, messages: Sequence[Message]) -> asyncio.Future[list[Outcome]]:
        """Queue ``messages`` (at least one) for the batch of this loop iteration, each
        as ``submit`` would; the future gets the list of their outcomes, in order, once
        every one is known, or raises what the batch raised for all of them. Cancelled
        before the batch starts, it leaves every one of them out."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Outcome]] = loop.create_future()
        self._groups.add(future)
        self._futures.extend(repeat(future, len(messages)))
        self._messages.extend(messages)
        if len(self._messages) == len(messages):
            self._start(loop)
        return future

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        # The task's first step runs after the callbacks already ready (the other
        # producers woken with this one), and takes everything queued by then. Tasks
        # start in the order they are created, so batches reach the serialization
        # point in submission order.
        metrics = self.metrics
        task = loop.create_task(
            self._append_queued() if metrics is None else self._append_timed(metrics)
        )
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _take(
        self,
    ) -> tuple[list[Message], list[asyncio.Future[Any]], set[asyncio.Future[Any]]]:
        """The queued batch and its groups, without the messages of cancelled
        producers."""
        messages, futures, groups = self._messages, self._futures, self._groups
        self._messages, self._futures, self._groups = [], [], set()
        if any(map(_cancelled, futures)):
            kept = [(m, f) for m, f in zip(messages, futures, strict=True) if not f.cancelled()]
            messages, futures = [m for m, _ in kept], [f for _, f in kept]
        return messages, futures, groups

    async def _append_queued(self) -> None:
        raise NotImplementedError

    async def _append_timed(self, metrics: WALMetrics) -> None:
        """``_append_queued``, recorded as one batch (``AppendRecorder.batch_started``):
        the batch it takes in this same step, nothing joins it after this count."""
        flight = metrics.batch_started(id(self._messages[0]), len(self._messages))
        try:
            await self._append_queued()
        finally:
            metrics.batch_ended(flight)

    async def drain(self) -> None:
        """Wait until every batch, the queued one included, has been appended (or
        failed): what the WAL does before it closes."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


@final
class AppendCoalescer(_Coalescer):
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
        messages, futures, groups = self._take()
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
                await self._one_by_one(messages, futures, groups)
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
        elif groups or any(map(_done, futures)):  # or a producer was cancelled meanwhile
            _answer(futures, results, groups)
        else:  # the usual batch: resolved without a bytecode per producer
            _consume(map(_set_result, futures, results))

    async def _one_by_one(
        self,
        messages: list[Message],
        futures: list[asyncio.Future[Any]],
        groups: set[asyncio.Future[Any]],
    ) -> None:
        # Started in order, so they are serialized in order; each gets its own answer.
        appends = [asyncio.ensure_future(self._append_one(message)) for message in messages]
        await asyncio.wait(appends)
        _answer(futures, [outcome_of(append) for append in appends], groups)


@final
class KeyedCoalescer(_Coalescer):
    """Gathers the keyed messages ``submit``ted within one loop iteration into one batch
    for ``append_each`` (the chain's ``CoalescingInterceptor``), which answers each
    message on its own. A future gets its message's result or error; a message that
    ``append_each`` leaves unanswered (None) is appended on its own through
    ``append_alone`` (the whole chain), in a task, and its future gets that outcome."""

    __slots__ = ("_append_alone", "_append_each")

    def __init__(self, append_each: AppendEach, append_alone: AppendNext) -> None:
        super().__init__()
        self._append_each = append_each
        self._append_alone = append_alone

    async def _append_queued(self) -> None:
        """Hand the queued messages to ``append_each``, leaving out cancelled producers."""
        messages, futures, groups = self._take()
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
        if set(map(type, outcomes)) == _RESULTS_ONLY and not groups:
            if not any(map(_done, futures)):
                results = cast(Sequence[AppendResult], outcomes)
                _consume(map(_set_result, futures, results))  # the usual batch, in C loops
                return
        if None in outcomes:
            outcomes = await self._alone_where_unanswered(messages, futures, groups, outcomes)
        _answer(futures, outcomes, groups)

    async def _alone_where_unanswered(
        self,
        messages: list[Message],
        futures: list[asyncio.Future[Any]],
        groups: set[asyncio.Future[Any]],
        outcomes: Sequence[AppendResult | Exception | None],
    ) -> list[Outcome | None]:
        """Append each message ``append_each`` left unanswered on its own: a lone
        producer's in a task of its own (its future gets the outcome; None in the
        returned list, which ``_answer`` skips), a group's awaited here; the outcomes,
        completed."""
        answered = list(outcomes)
        waited: dict[int, asyncio.Future[AppendResult]] = {}
        for i, outcome in enumerate(outcomes):
            if outcome is not None or futures[i].done():
                continue
            if futures[i] in groups:
                waited[i] = asyncio.ensure_future(self._append_alone(messages[i]))
            else:
                self._alone(messages[i], futures[i])
        if waited:
            await asyncio.wait(waited.values())
            for i, append in waited.items():
                answered[i] = outcome_of(append)
        return answered

    def _alone(self, message: Message, future: asyncio.Future[AppendResult]) -> None:
        """Append ``message`` down the whole chain in a task; ``future`` gets the outcome
        (cancelling ``future`` cancels the append, as cancelling ``append`` would)."""
        task = asyncio.ensure_future(self._append_alone(message))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(lambda done: _settle(future, done))
        future.add_done_callback(lambda settled: settled.cancelled() and task.cancel())


#: The types of the outcomes of a batch whose every message has its result.
_RESULTS_ONLY = frozenset({AppendResult})
_cancelled = asyncio.Future.cancelled
_done = asyncio.Future.done
_set_result = asyncio.Future.set_result
#: Runs an iterator to its end, keeping nothing.
_consume = collections.deque[object](maxlen=0).extend


def outcome_of(append: asyncio.Future[AppendResult]) -> Outcome:
    """What a finished append gave: its result or its error (a cancelled append:
    ``AppendOutcomeUnknown``, which it is to whoever waits for it)."""
    if append.cancelled():
        return AppendOutcomeUnknown("the append was cancelled; it may or may not be in the log")
    exc = append.exception()
    if exc is None:
        return append.result()
    if isinstance(exc, Exception):
        return exc
    return AppendOutcomeUnknown(f"the append was interrupted ({exc!r})")


def _answer(
    futures: Sequence[asyncio.Future[Any]],
    outcomes: Sequence[Outcome | None],
    groups: set[asyncio.Future[Any]],
) -> None:
    """Give each lone future its message's outcome, each group's future the list of
    its messages' outcomes; None (answered elsewhere) and done futures are skipped."""
    collected: dict[asyncio.Future[Any], list[Outcome | None]] = {g: [] for g in groups}
    for future, outcome in zip(futures, outcomes, strict=True):
        group = collected.get(future)
        if group is not None:
            group.append(outcome)
        elif outcome is None or future.done():
            continue
        elif isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    for future, group in collected.items():
        if not future.done():
            future.set_result(group)


def _settle(future: asyncio.Future[AppendResult], done: asyncio.Future[AppendResult]) -> None:
    """Give ``future`` the outcome of ``done`` (unless it was cancelled meanwhile)."""
    if done.cancelled():
        future.cancel()
        return
    exc = done.exception()  # retrieved even if nobody waits for it any more
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())


def _fail(futures: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(exc)
