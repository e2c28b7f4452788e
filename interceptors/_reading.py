"""Reading the WAL's own log from inside an interceptor (recovery on open, resolving an
ambiguous append): a bounded stretch of the log, up to a known newest message."""

from __future__ import annotations

from collections.abc import AsyncIterator

from walsvc.core._chain import InterceptorContext
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage

__all__ = ("read_through",)


async def read_through(
    context: InterceptorContext, start: DeliverPolicy, last: MessageId, min_timetick: int = 0
) -> AsyncIterator[ImmutableMessage]:
    """The persisted messages from ``start`` through ``last`` (inclusive) with a tick >=
    ``min_timetick``; ``last`` itself must pass that floor (it is the newest message).

    Nothing if ``start`` is the log's start and ``last`` was truncated away (every
    message through it went with it): a read of what is retained would otherwise wait
    for the next append. A read from an id raises ``WALTruncated`` if that id is gone.
    A truncation through ``last`` while the read runs is not looked for."""
    if start.kind == "all" and not await _retained(context, last):
        return
    scanner = context.read(start, [Filter(min_timetick=min_timetick)])
    try:
        async for message in scanner:
            if message.persisted:
                yield message
            if not message.message_id < last:
                return
    finally:
        await scanner.aclose()


async def _retained(context: InterceptorContext, last: MessageId) -> bool:
    """Whether ``last`` is still in the log: one more scanner (on a broker backend, one
    more consumer), which delivers ``last`` at once or raises ``WALTruncated``."""
    scanner = context.read(DeliverPolicy.start_from(last))
    try:
        await anext(scanner)
    except WALTruncated:
        return False
    finally:
        await scanner.aclose()
    return True
