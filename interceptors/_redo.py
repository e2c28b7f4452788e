"""Redo: retry appends that failed with a retriable error (``WALError.retriable``: the
backend promises nothing was written), with jittered exponential backoff, until they
succeed, the caller's deadline cancels them, or ``give_up_after`` seconds pass.

Never retries ``WALFenced`` (a newer writer owns the pchannel) or
``AppendOutcomeUnknown`` (the message may be in the log: a blind retry could duplicate
it; the dedup interceptor resolves those for messages with an idempotency key).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, final

from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.core._errors import WALError, WALFenced
from walsvc.core._message import AppendResult, Message

__all__ = ("Redo",)

_T = TypeVar("_T")


@final
class Redo:
    """Retries retriable append failures with backoff (first delay ``base_delay``,
    doubling up to ``max_delay``, with jitter) for at most ``give_up_after`` seconds,
    then raises the last error. Wrap the append in ``anyio.fail_after`` or
    ``asyncio.timeout`` to bound it by your own deadline; cancellation stops the retries.
    ``sleep`` and ``clock`` are injectable for tests."""

    __slots__ = ("_base_delay", "_clock", "_give_up_after", "_max_delay", "_sleep", "retries")

    def __init__(
        self,
        *,
        base_delay: float = 0.005,
        max_delay: float = 0.5,
        give_up_after: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < base_delay <= max_delay:
            raise ValueError("need 0 < base_delay <= max_delay")
        if not give_up_after >= 0:
            raise ValueError("give_up_after must be >= 0 seconds")
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._give_up_after = give_up_after
        self._sleep = sleep
        self._clock = clock
        #: How many retries this interceptor made (for stats and tests).
        self.retries = 0

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        """Append, retrying retriable failures."""
        try:
            return await call_next(message)
        except WALError as exc:
            if not exc.retriable or isinstance(exc, WALFenced):
                raise
            return await self._retry(lambda: call_next(message), exc)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        """Append a batch, retrying it whole (a retriable failure wrote none of it)."""
        try:
            return await call_next(messages)
        except WALError as exc:
            if not exc.retriable or isinstance(exc, WALFenced):
                raise
            return await self._retry(lambda: call_next(messages), exc)

    async def _retry(self, attempt: Callable[[], Awaitable[_T]], error: WALError) -> _T:
        deadline = self._clock() + self._give_up_after
        delay = self._base_delay
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise error
            await self._sleep(min(remaining, delay * random.uniform(0.5, 1.0)))
            delay = min(delay * 2, self._max_delay)
            self.retries += 1
            try:
                return await attempt()
            except WALError as exc:
                if not exc.retriable or isinstance(exc, WALFenced):
                    raise
                error = exc
