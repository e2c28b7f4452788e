"""The event loop never stalls on a read (issue 21, section 3): every read path decodes a
bounded step at a time and yields to the loop once the steps of one loop iteration
(every reader of the loop together) reach ``walsvc.core._budget.ITERATION``.

Not timing-based: a callback that schedules itself with ``call_soon`` runs exactly once
per loop iteration, so it numbers the iterations; the tests count the records delivered
in each one.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import walsvc
from walsvc import DeliverPolicy, Filter, ImmutableMessage, Message
from walsvc.core._budget import CACHED_COST, DECODE_COST, ITERATION, STEP

#: Records one loop iteration may deliver: less than 2 * (ITERATION + STEP) units (see
#: walsvc.core._budget), a decoded record costing DECODE_COST.
BOUND: Final = 2 * (ITERATION + STEP) // DECODE_COST
RECORDS: Final = 6000  # six frames of 1000 records: each far above one step
_TIMEOUT: Final = 30.0


class Iterations:
    """Numbers the iterations of the running loop (a self-rescheduling ``call_soon``)."""

    def __init__(self) -> None:
        self.count = 0
        self._loop = asyncio.get_running_loop()
        self._running = True
        self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.count += 1
        if self._running:
            self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._running = False


@contextlib.contextmanager
def iterations() -> Iterator[Iterations]:
    counter = Iterations()
    try:
        yield counter
    finally:
        counter.stop()


def _messages(n: int, start: int = 0) -> list[Message]:
    return [Message(payload=b"%d" % i, vchannel=f"v{i % 4}") for i in range(start, start + n)]


async def _fill(url: str, records: int) -> None:
    async with await walsvc.open_wal(url, "p", interceptors=[], sync="none") as wal:
        for start in range(0, records, 1000):
            await wal.append_many(_messages(1000, start))


async def _drain(
    wal: walsvc.WAL,
    counter: Iterations,
    per_iteration: Counter[int],
    want: int,
    deliver: DeliverPolicy | None = None,
    filters: list[Filter] | None = None,
    use_cache: bool = True,
) -> list[ImmutableMessage]:
    got: list[ImmutableMessage] = []
    policy = deliver or DeliverPolicy.all()
    async with wal.read(policy, filters or [], use_cache=use_cache) as scanner:
        async for batch in scanner.batches():
            per_iteration[counter.count] += len(batch)
            got += batch
            if len(got) >= want:
                return got
    raise AssertionError("the scanner ended")


async def test_file_catch_up_yields_between_steps(tmp_path: Path) -> None:
    """Ten read-only scanners catching up at once over frames of 1000 records: every
    message arrives, in order, and no loop iteration delivers more than BOUND records
    in all (before: one frame, or a whole 1 MiB block, per scanner at once)."""
    url = f"file://{tmp_path}"
    await _fill(url, RECORDS)
    per_iteration: Counter[int] = Counter()
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        with iterations() as counter:
            async with asyncio.timeout(_TIMEOUT):
                results = await asyncio.gather(
                    *(_drain(wal, counter, per_iteration, RECORDS) for _ in range(10))
                )
    for got in results:
        assert [m.payload for m in got] == [b"%d" % i for i in range(RECORDS)]
        assert [m.message_id.seq for m in got] == list(range(RECORDS))  # type: ignore[attr-defined]
    assert sum(per_iteration.values()) == 10 * RECORDS
    assert max(per_iteration.values()) <= BOUND
    assert len(per_iteration) >= 10 * RECORDS // BOUND


async def test_file_filtered_and_mid_frame_reads_are_whole(tmp_path: Path) -> None:
    """Steps that stop inside a frame resume where they stopped: a filtered read and a
    read starting inside a frame deliver exactly what they should."""
    url = f"file://{tmp_path}"
    await _fill(url, RECORDS)
    per_iteration: Counter[int] = Counter()
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        with iterations() as counter:
            async with asyncio.timeout(_TIMEOUT):
                filtered = await _drain(
                    wal, counter, per_iteration, RECORDS // 4, filters=[Filter(vchannels=["v1"])]
                )
                ids = await _drain(wal, counter, Counter(), 1, DeliverPolicy.all())
                middle = await _drain(
                    wal,
                    counter,
                    per_iteration,
                    RECORDS - 1234,
                    DeliverPolicy.start_from(type(ids[0].message_id)(1234)),  # type: ignore[call-arg]
                )
    assert [m.payload for m in filtered] == [b"%d" % i for i in range(1, RECORDS, 4)]
    assert [m.payload for m in middle] == [b"%d" % i for i in range(1234, RECORDS)]
    assert max(per_iteration.values()) <= BOUND


async def test_memory_catch_up_yields_between_steps() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    per_iteration: Counter[int] = Counter()
    async with await walsvc.open_wal(url, "p", interceptors=[]) as wal:
        for start in range(0, RECORDS, 1000):
            await wal.append_many(_messages(1000, start))
        with iterations() as counter:
            async with asyncio.timeout(_TIMEOUT):
                results = await asyncio.gather(
                    *(
                        _drain(wal, counter, per_iteration, RECORDS, use_cache=False)
                        for _ in range(3)
                    )
                )
    for got in results:
        assert [m.payload for m in got] == [b"%d" % i for i in range(RECORDS)]
    assert max(per_iteration.values()) <= BOUND


async def test_tail_cache_reads_yield_between_steps() -> None:
    """Readers of a writer's tail cache take a bounded step of entries at a time too
    (before: 1024 entries a batch, one batch after another with no yield)."""
    url = f"memory://{uuid.uuid4().hex}"
    bound = 2 * (ITERATION + STEP) // CACHED_COST
    per_iteration: Counter[int] = Counter()
    async with await walsvc.open_wal(url, "p", interceptors=[]) as wal:
        readers = [wal.read(DeliverPolicy.latest()) for _ in range(3)]
        first = await wal.append(Message(payload=b"start", vchannel="v0"))
        for start in range(0, RECORDS, 1000):
            await wal.append_many(_messages(1000, start))
        results: list[list[ImmutableMessage]] = []
        with iterations() as counter:
            async with asyncio.timeout(_TIMEOUT):
                for reader in readers:
                    assert (await anext(reader)).message_id == first.message_id
                    assert reader.stats().source == "cache"

                async def drain(reader: walsvc.Scanner) -> None:
                    got: list[ImmutableMessage] = []
                    async for batch in reader.batches():
                        per_iteration[counter.count] += len(batch)
                        got += batch
                        if len(got) >= RECORDS:
                            break
                    results.append(got)
                    await reader.aclose()

                await asyncio.gather(*(drain(r) for r in readers))
    for got in results:
        assert [m.payload for m in got] == [b"%d" % i for i in range(RECORDS)]
    assert max(per_iteration.values()) <= bound
