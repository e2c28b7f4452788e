"""The newest keys of the log: what the dedup window's rebuild on open reads.

A window holds at most ``max_keys`` keys, younger than ``max_age``; the rebuild needs
the newest of them, not every key ``max_age`` allows: a busy log holds millions in ten
minutes (a node's log is all keyed appends: its producers'). So the log is read back
from its newest tick in stretches, each read forward, until they hold enough keys or
reach the floor of ``max_age``:

- where ids count messages (``SequenceMessageId``: memory, file, Kafka), a stretch
  holds about as many messages as keys are still wanted (``_budget``): all the rest of
  the window if that is few enough (a small log is read in one go, as a read from the
  floor), else from the tick where the log to its end holds that many, found by a
  binary search on ticks (``Backend.start_at_timetick``, which reads no record). A
  burst of a million messages behind a quiet minute is read from its end, not whole;
- elsewhere (Pulsar) a stretch reaches back in ticks twice as far as the one before
  (the newest ``FIRST_STRETCH``, then two more, then four: a quiet log is crossed in a
  few reads).

Only keys are kept, never messages, and at most as many as wanted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import aclosing
from itertools import chain
from typing import Final

import msgspec

from walsvc.core._chain import InterceptorContext
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._ids import MessageId, SequenceMessageId
from walsvc.core._message import AppendResult
from walsvc.core._timetick import span_of_ms

from ._dedup_slots import Key, result_of, settled_key
from ._key_search import batches_since

__all__ = ("FIRST_STRETCH", "Settled", "newest_settled")

#: How far back from the newest tick the first stretch reaches (10 ms of ticks), where
#: stretches go by ticks.
FIRST_STRETCH: Final = span_of_ms(10)
#: How close to each other in ticks the search for a stretch's start may leave its
#: bounds (a millisecond).
_PRECISION: Final = span_of_ms(1)
#: Messages a stretch may hold beyond the keys still wanted: the search for a tick on
#: ``file://`` lands up to 256 KiB early (``_seek.NEAR``), which holds at most 7,085
#: envelopes (37 bytes is the least one takes).
_SLACK: Final = 8192


class Settled(msgspec.Struct, frozen=True, gc=False):
    """A key a message of the log settled, with its result and whether a transaction's
    CommitTxn settled it. Not tracked by the cycle collector: a rebuild makes a
    hundred thousand, and as tuples they set off a full collection (25 ms of a held
    loop, measured on a rebuild of 100k keys)."""

    key: Key
    result: AppendResult
    txn: bool


async def newest_settled(
    context: InterceptorContext, floor: int, latest: MessageId, enough: int
) -> tuple[int, Iterator[Settled]]:
    """The newest ``enough`` keys settled in the log through ``latest`` with a tick >=
    ``floor`` (fewer if it holds fewer), in log order (an iterator: the caller takes
    them a step at a time), and the tick from which every key settled is among them
    (see the module docs for how far it reads)."""
    top = await context.last_durable_timetick()
    floor_start = await context.start_at_timetick(floor)
    stretches: list[deque[Settled]] = []
    found = 0
    high: int | None = None  # the newest stretch: through latest
    high_at = _next_position(latest)  # where the stretch before ends, if ids count
    span = FIRST_STRETCH
    while True:
        budget = _budget(enough - found)
        end_tick = top + 1 if high is None else high
        if high_at is not None:  # ids count messages: the stretch is found by count
            if _held(floor_start, high_at) <= budget:  # the rest of the window fits
                low, start = floor, floor_start
            else:
                low, start = await _later_start(context, floor, end_tick, high_at, budget)
        else:  # by ticks, each stretch reaching twice as far back as the one before
            low = max(floor, end_tick - span)
            span *= 2
            start = floor_start if low <= floor else await context.start_at_timetick(low)
            if _reaches(start, floor_start):  # its read covers the floor's: take that
                low, start = floor, floor_start
        keys: deque[Settled] = deque(maxlen=enough - found)
        dropped_below = await _settled_between(context, start, low, high, latest, keys)
        stretches.append(keys)
        found += len(keys)
        complete_from = max(low, dropped_below)
        if found >= enough or low <= floor:
            break
        high = low
        if high_at is not None:
            high_at = _position(start)
    return complete_from, chain.from_iterable(reversed(stretches))


def _budget(wanted: int) -> int:
    """Messages a stretch may hold while ``wanted`` keys are still wanted."""
    return wanted + wanted // 4 + _SLACK


def _position(start: DeliverPolicy) -> int | None:
    """The sequence number a read from ``start`` begins at (0: the log's start), or None
    where ids do not count messages."""
    if start.kind == "all":
        return 0
    first = start.message_id
    return first.seq if isinstance(first, SequenceMessageId) else None


def _next_position(latest: MessageId) -> int | None:
    """The sequence number after ``latest``, or None where ids do not count messages."""
    return latest.seq + 1 if isinstance(latest, SequenceMessageId) else None


def _held(start: DeliverPolicy, end: int) -> int:
    """About how many messages a read from ``start`` to sequence number ``end`` holds
    (``end``: where ids count messages, as the caller knows)."""
    first = _position(start)
    return end if first is None else end - first


async def _later_start(
    context: InterceptorContext, low: int, high: int, end: int, budget: int
) -> tuple[int, DeliverPolicy]:
    """The lowest tick in (``low``, ``high``), to a millisecond, from which the log to
    sequence number ``end`` holds at most ``budget`` messages (or, found on the way, at
    least half of that), with where a read of it starts: a binary search on ticks,
    reading no record (about 20 searches for a tick over ``max_age``'s ten minutes). If
    none does (a millisecond, or the file search's 256 KiB, holds more), the highest tick
    found to hold more, and its start: the stretch holds one such step more than the
    budget, not all of itself."""
    found: tuple[int, DeliverPolicy] | None = None
    below, above = low, high
    while above - below > _PRECISION:
        middle = (below + above) // 2
        at_middle = await context.start_at_timetick(middle)
        held = _held(at_middle, end)
        if held > budget:
            below = middle
        else:
            above, found = middle, (middle, at_middle)
            if held >= budget // 2:
                break
    return found if found is not None else (below, await context.start_at_timetick(below))


def _reaches(start: DeliverPolicy, floor_start: DeliverPolicy) -> bool:
    """True if a read from ``start`` begins where the read from ``floor_start`` does, or
    before it (a read of ticks from the stretch's low on would skip the messages between
    the floor and it)."""
    if start.kind == "all":
        return True
    first, floor_first = start.message_id, floor_start.message_id
    return (
        floor_start.kind != "all"
        and first is not None
        and floor_first is not None
        and not (floor_first < first)
    )


async def _settled_between(
    context: InterceptorContext,
    start: DeliverPolicy,
    low: int,
    high: int | None,
    latest: MessageId,
    keys: deque[Settled],
) -> int:
    """Append to ``keys`` (a bounded deque: the newest stay) the keys settled by the
    messages through ``latest`` with a tick in [``low``, ``high``) (``high`` None: no
    bound), read from ``start`` (where ``low`` begins); return 0, or one past the tick
    of the newest key the deque dropped."""
    dropped_below = 0
    async with aclosing(batches_since(context, low, latest, start)) as batches:
        async for batch in batches:
            for message in batch:
                if message.idempotency_key is None:
                    continue
                if high is not None and message.timetick >= high:
                    return dropped_below
                key = settled_key(message)
                if key is None:
                    continue
                if len(keys) == keys.maxlen:
                    dropped_below = keys[0].result.timetick + 1
                keys.append(Settled(key, result_of(message), message.txn is not None))
            if high is not None and batch[-1].timetick >= high:
                return dropped_below
    return dropped_below
