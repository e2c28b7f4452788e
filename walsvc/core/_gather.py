"""Awaiting several calls to their end, whatever some of them raise."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ("await_all",)

_T = TypeVar("_T")


async def await_all(calls: Iterable[Awaitable[_T]]) -> list[_T]:
    """Await every one of ``calls`` together, each to its end; then raise the first
    error (in the order of ``calls``) if one raised, else return their results in that
    order. Unlike a plain ``asyncio.gather``, a call that fails leaves none of the
    others unawaited (a close that fails still lets every other close run)."""
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes  # type: ignore[return-value]  # none is an exception here
