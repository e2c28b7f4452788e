"""Id ranges of one pchannel, and reading exactly the messages a range owns.

A range ``(after, end]`` owns every message ``WAL.read`` delivers whose id is above
``after`` and at most ``end``; a committed transaction (one ``TXN`` message) is owned by
the range that holds its CommitTxn, wherever its BeginTxn and bodies lie. Ranges that
tile a pchannel therefore deliver each message and each committed transaction exactly
once: batch partitions (a large pchannel split by id) and the micro-batches of a stream
(offset to offset) are both such tilings.

To see the transactions open at ``after``, a range replays from the last-confirmed id of
the first message after ``after`` (every transaction open there began at or after it),
through the reorder and transaction stages of ``WAL.read``, and delivers only what it
owns. It reads raw (unfiltered) records up to ``end`` so that it knows when it is done,
and fails with ``RangeStalled`` instead of waiting forever if the log stops short of
``end`` (truncated, or a backend that cannot serve it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

import msgspec

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import InvalidArgument, WALError, WALTruncated
from walsvc.core._ids import MessageId, SequenceMessageId, unmarshal_message_id
from walsvc.core._message import ImmutableMessage
from walsvc.wal._open import open_wal
from walsvc.wal._wal import LocalWAL as WAL

from ._options import SourceOptions

__all__ = (
    "IdRange",
    "RangeStalled",
    "checked_id",
    "latest_ids",
    "open_reader",
    "plan_ranges",
    "raw_up_to",
    "replay_start",
    "split_range",
    "tile",
    "unless_stalled",
)

_T = TypeVar("_T")


class RangeStalled(WALError):
    """A range read made no progress towards the end of its range for ``stallTimeout``
    seconds: the log ends before it (truncated or unreachable)."""


class IdRange(msgspec.Struct, frozen=True):
    """The messages of ``pchannel`` with ids in ``(after, end]`` (marshalled ids;
    ``after`` None: from the start of the log)."""

    pchannel: str
    after: str | None
    end: str

    def bounds(self) -> tuple[MessageId | None, MessageId]:
        """``after`` and ``end`` as ids."""
        after = None if self.after is None else unmarshal_message_id(self.after)
        return after, unmarshal_message_id(self.end)


async def open_reader(options: SourceOptions, pchannel: str) -> WAL:
    """A read-only WAL of ``pchannel`` (never fences the writer)."""
    return await open_wal(options.url, pchannel, read_only=True, **options.backend_options)


async def latest_ids(options: SourceOptions) -> dict[str, MessageId | None]:
    """The newest message id of every pchannel the options name (None: empty log)."""

    async def latest(pchannel: str) -> MessageId | None:
        async with await open_reader(options, pchannel) as wal:
            return await wal.latest_message_id()

    found = await asyncio.gather(*(latest(p) for p in options.pchannels))
    return dict(zip(options.pchannels, found, strict=True))


def checked_id(pchannel: str, marshalled: str) -> MessageId:
    """A marshalled id from an option or an offset, or ``InvalidArgument`` naming it."""
    try:
        return unmarshal_message_id(marshalled)
    except WALError as exc:
        raise InvalidArgument(
            f"pchannel {pchannel!r}: bad message id {marshalled!r}: {exc}"
        ) from None


def split_range(whole: IdRange, records: int) -> list[IdRange]:
    """``whole`` cut into ranges of at most ``records`` ids each, when its ids are
    sequence numbers; else ``[whole]`` (ids of other backends cannot be counted)."""
    after, end = whole.bounds()
    if not isinstance(end, SequenceMessageId) or (
        after is not None and type(after) is not type(end)
    ):
        return [whole]
    first = -1 if after is None else after.seq
    cuts = [*list(range(first, end.seq, records)), end.seq]
    make = type(end)
    return [
        IdRange(
            whole.pchannel,
            None if low < 0 else make(low).marshal(),
            make(high).marshal(),
        )
        for low, high in itertools.pairwise(cuts)
    ]


def tile(wholes: list[IdRange], options: SourceOptions) -> list[IdRange]:
    """``wholes`` split into ranges of at most ``records_per_partition`` ids, and finer
    where needed so that there are at least ``min_partitions`` (counting only ranges of
    sequence ids, the ones that can be split)."""
    size = options.records_per_partition
    if options.min_partitions > 1:
        countable = sum(_id_count(w) for w in wholes)
        if countable:
            size = max(1, min(size, -(-countable // options.min_partitions)))
    return [part for whole in wholes for part in split_range(whole, size)]


def _id_count(whole: IdRange) -> int:
    """How many ids ``whole`` spans, if they are sequence numbers; else 0."""
    after, end = whole.bounds()
    if not isinstance(end, SequenceMessageId):
        return 0
    if after is None:
        return end.seq + 1
    return end.seq - after.seq if isinstance(after, SequenceMessageId) else 0


async def plan_ranges(options: SourceOptions) -> list[IdRange]:
    """The ranges of a batch read: each pchannel from its ``startAfter`` id (or its start)
    to its newest message now, split as ``tile`` does."""
    latest = await latest_ids(options)
    wholes: list[IdRange] = []
    for pchannel in options.pchannels:
        end = latest[pchannel]
        marshalled_after = options.start_after.get(pchannel)
        after = None if marshalled_after is None else checked_id(pchannel, marshalled_after)
        if end is None or (after is not None and _not_before(end, after)):
            continue
        wholes.append(IdRange(pchannel, None if after is None else after.marshal(), end.marshal()))
    return tile(wholes, options)


def _not_before(end: MessageId, after: MessageId) -> bool:
    """True if nothing after ``after`` is at or before ``end``."""
    try:
        return end <= after
    except TypeError:
        raise InvalidArgument(f"start id {after.marshal()} is not an id of this backend") from None


async def replay_start(
    wal: WAL, options: SourceOptions, after: MessageId | None, end: MessageId
) -> DeliverPolicy | None:
    """Where to replay from so that the transactions open at ``after`` are seen; None if
    no message lies in ``(after, end]``."""
    if after is None:
        return DeliverPolicy.all()
    batches = raw_up_to(wal, DeliverPolicy.start_after(after), end, options.stall_timeout)
    async with contextlib.aclosing(batches):  # type: ignore[type-var]
        async for raw, _ in batches:
            if not raw:
                return None
            first = raw[0]
            break
        else:
            return None
    confirmed = first.last_confirmed_id
    return DeliverPolicy.all() if confirmed is None else DeliverPolicy.start_from(confirmed)


async def raw_up_to(
    wal: WAL, start: DeliverPolicy, end: MessageId, stall_timeout: float
) -> AsyncIterator[tuple[Sequence[ImmutableMessage], bool]]:
    """Raw batches from ``start`` cut at ``end``, each with True once ``end`` is reached.
    A start before the first retained message starts at the first one."""
    started = False
    try:
        async for item in _raw_batches(wal, start, end, stall_timeout):
            started = True
            yield item
    except WALTruncated:
        if started:
            raise
        async for item in _raw_batches(wal, DeliverPolicy.all(), end, stall_timeout):
            yield item


async def unless_stalled(step: Awaitable[_T], wal: WAL, end: MessageId, stall_timeout: float) -> _T:
    """Await ``step`` (the next read of a range ending at ``end``), or raise
    ``RangeStalled`` after ``stall_timeout`` seconds without it."""
    try:
        async with asyncio.timeout(stall_timeout):
            return await step
    except TimeoutError:
        raise RangeStalled(
            f"pchannel {wal.pchannel!r}: no record for {stall_timeout:g} s while reading up"
            f" to {end.marshal()} (option stallTimeout)"
        ) from None


async def _raw_batches(
    wal: WAL, start: DeliverPolicy, end: MessageId, stall_timeout: float
) -> AsyncIterator[tuple[Sequence[ImmutableMessage], bool]]:
    async with wal.read(start, raw=True, use_cache=False) as scanner:
        batches = scanner.batches()
        try:
            while True:
                try:
                    batch = await unless_stalled(anext(batches), wal, end, stall_timeout)
                except StopAsyncIteration:
                    return
                if batch[-1].message_id < end:
                    yield batch, False
                    continue
                cut = len(batch)
                while cut and batch[cut - 1].message_id > end:
                    cut -= 1
                yield batch[:cut], True
                return
        finally:
            await batches.aclose()
