"""Reading the WAL's own log from inside an interceptor (recovery on open, resolving an
ambiguous append): a bounded stretch of the log, up to a known newest message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Final

from walsvc.core._chain import AsyncScanner, InterceptorContext
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage

__all__ = ("read_batches_through", "read_through")

#: How often a read of what is retained, still waiting for its first message, checks
#: whether a truncation took the message it reads through.
_RECHECK_SECONDS: Final = 1.0


async def read_through(
    context: InterceptorContext, start: DeliverPolicy, last: MessageId, min_timetick: int = 0
) -> AsyncGenerator[ImmutableMessage, None]:
    """The persisted messages from ``start`` through ``last`` (inclusive) with a tick >=
    ``min_timetick``; ``last`` itself must pass that floor (it is the newest message).

    Nothing if ``start`` is the log's start and ``last`` was truncated away (every
    message through it went with it), before the read or while it waits for its first
    message: a read of what is retained would otherwise wait for the next append. A
    read from an id, or one that a truncation overtakes later, raises ``WALTruncated``
    (the backends' scanners do when their next message is gone)."""
    opened = await _open(context, start, last, min_timetick)
    if opened is None:
        return
    scanner, first = opened
    try:
        if first.persisted:
            yield first
        if not first.message_id < last:
            return
        async for message in scanner:
            if message.persisted:
                yield message
            if not message.message_id < last:
                return
    finally:
        await scanner.aclose()


async def read_batches_through(
    context: InterceptorContext, start: DeliverPolicy, last: MessageId, min_timetick: int = 0
) -> AsyncGenerator[Sequence[ImmutableMessage], None]:
    """``read_through``'s messages in non-empty batches, as the scanner reads them: for
    reads that take every message (the rebuild on open), a step of the generators a
    batch instead of a message."""
    opened = await _open(context, start, last, min_timetick)
    if opened is None:
        return
    scanner, first = opened
    try:
        if first.persisted:
            yield (first,)
        if not first.message_id < last:
            return
        async for batch in scanner.batches():
            through, more = _through(batch, last)
            if through:
                yield through
            if not more:
                return
    finally:
        await scanner.aclose()


async def _open(
    context: InterceptorContext, start: DeliverPolicy, last: MessageId, min_timetick: int
) -> tuple[AsyncScanner, ImmutableMessage] | None:
    """A scanner of the read ``read_through`` describes, with its first message; None if
    there is nothing to read."""
    if start.kind == "all" and not await _retained(context, last):
        return None
    first_id = start.message_id
    if start.kind == "start_from" and first_id is not None and last < first_id:
        # Nothing through last (a search for a tick in a log truncated through its
        # newest message lands after it): a read would wait for the next append.
        return None
    scanner = context.read(start, [Filter(min_timetick=min_timetick)])
    try:
        first = await (
            _first_retained(context, scanner, last) if start.kind == "all" else anext(scanner)
        )
    except BaseException:
        await scanner.aclose()
        raise
    if first is None:
        await scanner.aclose()
        return None
    return scanner, first


def _through(
    batch: Sequence[ImmutableMessage], last: MessageId
) -> tuple[Sequence[ImmutableMessage], bool]:
    """The persisted messages of ``batch`` through ``last``, and whether the read goes
    on after them (none of them is ``last`` or later)."""
    more = batch[-1].message_id < last
    if not more:
        for index, message in enumerate(batch):
            if not message.message_id < last:
                batch = batch[: index + 1]
                break
    if all(message.persisted for message in batch):
        return batch, more
    return [message for message in batch if message.persisted], more


async def _first_retained(
    context: InterceptorContext, scanner: AsyncScanner, last: MessageId
) -> ImmutableMessage | None:
    """The first message of ``scanner``, a read of what is retained; None if, while it
    waits, ``last`` turns out truncated: then the retained log starts after ``last`` and
    the scanner waits for the next append. Each ``_RECHECK_SECONDS`` without a message, a
    probe looks, beside the read; a probe that fails says nothing (the read goes on)."""
    fetch: asyncio.Future[ImmutableMessage] = asyncio.ensure_future(anext(scanner))
    probe: asyncio.Future[bool] | None = None
    try:
        while True:
            if probe is None:
                await asyncio.wait((fetch,), timeout=_RECHECK_SECONDS)
                if not fetch.done():
                    probe = asyncio.ensure_future(_retained(context, last))
            else:
                await asyncio.wait((fetch, probe), return_when=asyncio.FIRST_COMPLETED)
            if fetch.done():
                return fetch.result()
            if probe is not None and probe.done():
                if probe.exception() is None and not probe.result():
                    return None
                probe = None
    finally:
        tasks = [task for task in (fetch, probe) if task is not None]
        for task in tasks:
            task.cancel()  # no-op for one done
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled():
                task.exception()  # seen: a failed read raised through fetch.result()


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
