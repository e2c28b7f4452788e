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

__all__ = ("read_through", "retained")


async def read_through(
    context: InterceptorContext, start: DeliverPolicy, last: MessageId, min_timetick: int = 0
) -> AsyncIterator[ImmutableMessage]:
    """The persisted messages from ``start`` through ``last`` (inclusive) with a tick >=
    ``min_timetick``; ``last`` itself must pass that floor (it is the newest message)."""
    scanner = context.read(start, [Filter(min_timetick=min_timetick)])
    try:
        async for message in scanner:
            if message.persisted:
                yield message
            if not message.message_id < last:
                return
    finally:
        await scanner.aclose()


async def retained(context: InterceptorContext, last: MessageId) -> bool:
    """Whether ``last`` (the newest message) is still in the log. ``read_through`` up to
    a message truncated away would wait for it until something newer is appended: the
    paths that may run after a truncation and before the next append ask this first
    (it opens one more scanner, which on a broker backend is a consumer)."""
    scanner = context.read(DeliverPolicy.start_from(last))
    try:
        await anext(scanner)
    except WALTruncated:
        return False
    finally:
        await scanner.aclose()
    return True
