"""Driving the async WAL from Spark's synchronous Python callbacks: one event loop per
call that needs one (a partition's whole read, a planning step), never one per row."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ("iterate", "run")

_T = TypeVar("_T")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` to completion on a fresh event loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        return runner.run(coroutine)


def iterate(make: Callable[[], AsyncIterator[_T]]) -> Iterator[_T]:
    """The items of the async iterator ``make()`` returns, pulled one at a time on one
    event loop that lives as long as this generator; closing the generator (Spark stops
    reading a partition early) closes the async iterator on that loop."""
    with asyncio.Runner(loop_factory=_new_loop) as runner:
        items = make()

        async def pull() -> _T:
            return await anext(items)

        try:
            while True:
                try:
                    item = runner.run(pull())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            close = getattr(items, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    runner.run(close())
