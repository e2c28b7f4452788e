"""An impatient client: one attempt at a call under a random deadline (none at all,
sometimes), or cancelled outright after a few loop iterations. The exactly-once tests and
the fault schedule's producer retry with it until an attempt answers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = ("GAVE_UP", "impatient_attempt")

_T = TypeVar("_T")

#: What ``impatient_attempt`` returns when the attempt was abandoned.
GAVE_UP: Final = object()


async def impatient_attempt(
    rng: random.Random, call: Callable[[], Awaitable[_T]], *, deadlines: tuple[float, ...]
) -> _T | object:
    """``await call()`` once: a quarter of the time under one of ``deadlines`` (seconds),
    a sixth cancelled after 0-4 loop iterations, else awaited to its end. Returns its
    result, or ``GAVE_UP`` if the deadline or the cancellation cut it short; raises what
    the call raises."""
    choice = rng.random()
    try:
        if choice < 0.25:
            async with asyncio.timeout(rng.choice(deadlines)):
                return await call()
        if choice < 0.4:
            task = asyncio.ensure_future(call())
            for _ in range(rng.randrange(5)):
                await asyncio.sleep(0)
            task.cancel()
            try:
                return await task
            except asyncio.CancelledError:
                return GAVE_UP
        return await call()
    except TimeoutError:
        return GAVE_UP
