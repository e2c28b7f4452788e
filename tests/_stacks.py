"""Where a run that hangs is stuck: the stacks of every task of the running loop and of
every thread, written to standard error (which pytest shows with a failed test). Fault
schedules call it when their hang guard fires, so a rare hang leaves its cause behind
instead of only a timeout."""

from __future__ import annotations

import asyncio
import faulthandler
import linecache
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

__all__ = ("dump_stacks", "stacks_on_timeout")


def dump_stacks(why: str, state: str = "") -> None:
    """Write ``why`` and ``state`` (what the caller knows of the run), then where each
    task of the running loop waits (the whole chain of coroutines it awaits through,
    innermost last), then every thread's Python stack."""
    out = sys.stderr
    tasks = asyncio.all_tasks()
    print(f"\n=== {why} ===", file=out)
    if state:
        print(state, file=out)
    print(f"=== the stacks of {len(tasks)} tasks ===", file=out)
    for task in tasks:
        print(f"--- {task.get_name()}: {task!r}", file=out)
        for frame in _awaited_frames(task.get_coro()):
            code = frame.f_code
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            print(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}: {line}", file=out)
    print("=== the stacks of the threads ===", file=out, flush=True)
    faulthandler.dump_traceback(file=out, all_threads=True)


def _awaited_frames(awaitable: Any) -> list[FrameType]:
    """The frames of a suspended coroutine and of what it awaits, outermost first
    (``Task.print_stack`` shows only the outermost)."""
    frames = []
    while awaitable is not None:
        frame = next(
            (getattr(awaitable, name) for name in _FRAMES if getattr(awaitable, name, None)),
            None,
        )
        if frame is not None:
            frames.append(frame)
        awaitable = next(
            (getattr(awaitable, name) for name in _AWAITS if getattr(awaitable, name, None)),
            None,
        )
    return frames


_FRAMES = ("cr_frame", "gi_frame", "ag_frame")
_AWAITS = ("cr_await", "gi_yieldfrom", "ag_await")


@asynccontextmanager
async def stacks_on_timeout(
    seconds: float, what: str, state: Callable[[], str] | None = None
) -> AsyncIterator[None]:
    """``asyncio.timeout(seconds)`` that dumps the stacks (``dump_stacks``, with what
    ``state()`` says) when its time is up, before it cancels anything (a cancelled task
    has unwound its stack)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as scope:

        def time_up() -> None:
            dump_stacks(f"{what} did not end within {seconds} s", state() if state else "")
            scope.reschedule(loop.time())

        handle = loop.call_later(seconds, time_up)
        try:
            yield
        finally:
            handle.cancel()
