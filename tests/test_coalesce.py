"""Coalesced appends: concurrent plain appends to a backend whose acks take time (here
the file log) share one pass down the batch chain, and each producer still gets its own
answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from _chain_support import BatchSizes

import walsvc
from interceptors import default_chain
from walsvc import AppendResult, Message, MessageTooLarge, MessageType, WALClosed, WALFenced
from walsvc.core._chain import AppendBatchNext, AppendNext

PRODUCERS = 40


def message(n: int, size: int = 10) -> Message:
    return Message(payload=n.to_bytes(4, "big") * (size // 4), vchannel=f"v{n % 3}")


async def open_file(
    path: Path, *, observe: BatchSizes | None = None, **options: object
) -> walsvc.WAL:
    chain = default_chain(sync_interval=None)
    if observe is not None:
        chain.append(observe)
    return await walsvc.open_wal(f"file://{path}", "p0", interceptors=chain, **options)


async def read_back(path: Path) -> list[bytes]:
    async with await walsvc.open_wal(f"file://{path}", "p0", read_only=True) as wal:
        last = await wal.latest_message_id()
        payloads = []
        async with wal.read(timeticks=True) as scanner:
            async for got in scanner:
                if got.type is not MessageType.TIME_TICK:
                    payloads.append(got.payload)
                if got.message_id == last:
                    break
    return payloads


async def test_concurrent_appends_share_batches_and_land_in_call_order(tmp_path: Path) -> None:
    sizes = BatchSizes()
    async with await open_file(tmp_path, observe=sizes) as wal:
        await wal.wait_ready()
        appends = [asyncio.ensure_future(wal.append(message(n))) for n in range(PRODUCERS)]
        results = await asyncio.gather(*appends)
    # Tasks started in order are serialized in order: ids and ticks follow the calls.
    assert [r.message_id for r in results] == sorted(r.message_id for r in results)
    assert [r.timetick for r in results] == sorted({r.timetick for r in results})
    assert sum(sizes.sizes) == PRODUCERS
    assert len(sizes.sizes) < PRODUCERS  # some appends shared a batch
    assert await read_back(tmp_path) == [message(n).payload for n in range(PRODUCERS)]


async def test_a_lone_append_is_a_batch_of_one(tmp_path: Path) -> None:
    sizes = BatchSizes()
    async with await open_file(tmp_path, observe=sizes) as wal:
        await wal.wait_ready()
        for n in range(3):
            await wal.append(message(n))
    assert sizes.sizes == [1, 1, 1]


async def test_only_the_oversized_message_of_a_batch_fails(tmp_path: Path) -> None:
    async with await open_file(tmp_path, max_message_size=4096) as wal:
        await wal.wait_ready()
        sizes = [10, 10, 8192, 10, 10]
        appends = [
            asyncio.ensure_future(wal.append(message(n, size))) for n, size in enumerate(sizes)
        ]
        outcomes = await asyncio.gather(*appends, return_exceptions=True)
    assert isinstance(outcomes[2], MessageTooLarge)
    assert all(isinstance(o, AppendResult) for i, o in enumerate(outcomes) if i != 2)
    assert await read_back(tmp_path) == [message(n).payload for n in (0, 1, 3, 4)]


async def test_a_producer_cancelled_before_its_batch_starts_appends_nothing(
    tmp_path: Path,
) -> None:
    async with await open_file(tmp_path) as wal:
        await wal.wait_ready()
        appends = [asyncio.ensure_future(wal.append(message(n))) for n in range(5)]
        await asyncio.sleep(0)  # every append is queued; none is in a batch yet
        appends[1].cancel()
        outcomes = await asyncio.gather(*appends, return_exceptions=True)
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert await read_back(tmp_path) == [message(n).payload for n in (0, 2, 3, 4)]


async def test_every_producer_of_a_fenced_batch_learns_it(tmp_path: Path) -> None:
    old = await open_file(tmp_path)
    try:
        await old.wait_ready()
        async with await open_file(tmp_path) as new:
            await new.wait_ready()
            outcomes = await asyncio.gather(
                *(old.append(message(n)) for n in range(PRODUCERS)), return_exceptions=True
            )
            assert all(isinstance(o, WALFenced) for o in outcomes), outcomes
    finally:
        await old.aclose()
    assert await read_back(tmp_path) == []


async def test_appends_queued_when_the_wal_closes_are_written(tmp_path: Path) -> None:
    wal = await open_file(tmp_path)
    await wal.wait_ready()
    appends = [asyncio.ensure_future(wal.append(message(n))) for n in range(PRODUCERS)]
    await asyncio.sleep(0)  # queued, not yet in a batch
    await wal.aclose()
    results = await asyncio.gather(*appends)
    assert len(results) == PRODUCERS
    assert await read_back(tmp_path) == [message(n).payload for n in range(PRODUCERS)]
    with pytest.raises(WALClosed):
        await wal.append(message(0))


class HoldBatches:
    """A pass-through interceptor that holds every batch until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        self.holding.set()
        await self.release.wait()
        return await call_next(messages)


async def test_a_producer_cancelled_while_its_batch_runs_leaves_the_others_answered(
    tmp_path: Path,
) -> None:
    hold = HoldBatches()
    chain = [*default_chain(sync_interval=None), hold]
    async with await walsvc.open_wal(f"file://{tmp_path}", "p0", interceptors=chain) as wal:
        await wal.wait_ready()
        appends = [asyncio.ensure_future(wal.append(message(n))) for n in range(5)]
        await hold.holding.wait()
        appends[2].cancel()
        hold.release.set()
        async with asyncio.timeout(10):  # a producer left unanswered fails, not hangs
            outcomes = await asyncio.gather(*appends, return_exceptions=True)
    assert isinstance(outcomes[2], asyncio.CancelledError)
    results = [o for i, o in enumerate(outcomes) if i != 2]
    assert all(isinstance(o, AppendResult) for o in results)
    # The batch was already on its way: the cancelled producer's message is in the log.
    assert await read_back(tmp_path) == [message(n).payload for n in range(5)]


class DropsAResult:
    """A faulty interceptor: returns one result fewer than the batch it appended."""

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        return (await call_next(messages))[:-1]


async def test_a_chain_that_loses_a_result_fails_every_producer_of_the_batch(
    tmp_path: Path,
) -> None:
    chain = [*default_chain(sync_interval=None), DropsAResult()]
    async with await walsvc.open_wal(f"file://{tmp_path}", "p0", interceptors=chain) as wal:
        await wal.wait_ready()
        outcomes = await asyncio.gather(
            *(wal.append(message(n)) for n in range(PRODUCERS)), return_exceptions=True
        )
    assert all(isinstance(o, walsvc.AppendOutcomeUnknown) for o in outcomes), outcomes
    assert "returned" in str(outcomes[0])
