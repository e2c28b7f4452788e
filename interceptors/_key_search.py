"""Where keyed messages are in the log: the reads ``Dedup`` makes when its window cannot
tell (the rebuild on open, an ambiguous append's resolution, a Recall of keys the window
dropped). Each reads a bounded stretch, at most up to the newest message
(``read_through``), and ends as soon as it can tell: every key found, or, for a Recall,
the window's horizon reached (the rebuild's reads, which end once they hold as many keys
as the window, are ``_newest_keys``'s). None keeps anything of the window's: callers
put what is found into it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import TypeVar

from walsvc.core._chain import InterceptorContext
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import AppendOutcomeUnknown, WALError, WALTruncated
from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage

from ._dedup_slots import Key, result_of, settled_key
from ._reading import read_batches_through, read_through

__all__ = ("batches_since", "find_keys", "find_keys_since")


def batches_since(
    context: InterceptorContext, tick: int, latest: MessageId, start: DeliverPolicy | None = None
) -> AsyncGenerator[Sequence[ImmutableMessage], None]:
    """The persisted messages with a tick >= ``tick`` through ``latest``, in batches,
    read from where the backend says that tick begins (``start_at_timetick``, unless the
    caller asked it: ``start``). If that start is truncated meanwhile, what is retained
    is read instead, from its start: a message may then come twice."""
    return _since(read_batches_through, context, tick, latest, start)


def messages_since(
    context: InterceptorContext, tick: int, latest: MessageId
) -> AsyncGenerator[ImmutableMessage, None]:
    """``batches_since``'s messages one at a time, for reads that stop as soon as they
    can tell (a Recall's)."""
    return _since(read_through, context, tick, latest, None)


_Item = TypeVar("_Item")
_Reader = Callable[[InterceptorContext, DeliverPolicy, MessageId, int], AsyncGenerator[_Item, None]]


async def _since(
    reader: _Reader[_Item],
    context: InterceptorContext,
    tick: int,
    latest: MessageId,
    start: DeliverPolicy | None,
) -> AsyncGenerator[_Item, None]:
    if start is None:
        start = await context.start_at_timetick(tick)
    try:
        async with aclosing(reader(context, start, latest, tick)) as items:
            async for item in items:
                yield item
    except WALTruncated:
        async with aclosing(reader(context, DeliverPolicy.all(), latest, tick)) as again:
            async for item in again:
                yield item


async def find_keys(
    context: InterceptorContext, keys: set[Key], floor: MessageId | None
) -> dict[Key, AppendResult]:
    """The results of the first messages from ``floor`` (None: the log's start) through
    the newest that settle ``keys``; raises what the read raises."""
    found: dict[Key, AppendResult] = {}
    latest = await context.latest_message_id()
    if latest is None or (floor is not None and latest < floor):
        return found
    start = DeliverPolicy.all() if floor is None else DeliverPolicy.start_from(floor)
    await _note_first_results(read_through(context, start, latest, 0), keys, found)
    return found


async def find_keys_since(
    context: InterceptorContext, keys: set[Key], since_tick: int, below_tick: int
) -> dict[Key, AppendResult]:
    """The results of the first messages with a tick in [``since_tick``, ``below_tick``)
    that settle ``keys``; ``AppendOutcomeUnknown`` if that stretch of the log cannot be
    read. The read ends at the first message at or above ``below_tick`` (log order is tick
    order), or once every key is found. Truncated messages are not found: their keys are
    forgotten, as the rebuild on open forgets them."""
    found: dict[Key, AppendResult] = {}
    try:
        latest = await context.latest_message_id()
        if latest is None:
            return found
        messages = messages_since(context, since_tick, latest)
        await _note_first_results(messages, keys, found, below_tick)
    except (WALError, OSError) as exc:
        raise AppendOutcomeUnknown(
            f"whether {len(keys)} appends sent again landed cannot be told: the dedup"
            f" window dropped keys since timetick {since_tick}, and reading the log"
            f" from there failed ({exc!r})"
        ) from exc
    return found


async def _note_first_results(
    messages: AsyncGenerator[ImmutableMessage, None],
    keys: set[Key],
    found: dict[Key, AppendResult],
    below_tick: int | None = None,
) -> None:
    """Put into ``found`` (empty) the result of the first of ``messages`` that settles
    each of ``keys``; stop once every key is found, or at the first message with a tick
    at or above ``below_tick``."""
    try:
        async for message in messages:
            if below_tick is not None and message.timetick >= below_tick:
                return
            key = settled_key(message)
            if key in keys and key not in found:
                found[key] = result_of(message)
                if len(found) == len(keys):
                    return
    finally:
        await messages.aclose()
