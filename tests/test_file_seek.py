"""Finding a place in the log without reading the log: ``Backend.start_at_timetick`` (the
dedup window's rebuild starts there) and the file scanner's binary search for a start
record; and what follows for a reopened writer: damage outside the window it reads never
stops its appends, and plain appends never wait for the window's rebuild."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path

import pytest
from _chain_support import FakeClock, data, member
from _segments import whole_frames

import interceptors
import walsvc
from interceptors import Dedup
from walsvc import DeliverPolicy, HybridClock, ImmutableMessage, Message
from walsvc.backends._file._format import segment_seq
from walsvc.backends._file._seek import NEAR

PCHANNEL = "p"
PAYLOAD = 200


async def _build(url: str) -> list[ImmutableMessage]:
    """About 6 MiB in frames of 1 to 400 records (file://: 2 MiB segments, so searches
    run inside segments too); returns the log as stored."""
    rng = random.Random(7)
    options = {"segment_size": 2 << 20} if url.startswith("file") else {}
    async with await walsvc.open_wal(url, PCHANNEL, interceptors=[], **options) as wal:
        written = 0
        while written < 6 << 20:
            count = rng.choice((1, 3, 40, 400))
            await wal.append_many([Message(payload=bytes(PAYLOAD), vchannel="v")] * count)
            written += count * (PAYLOAD + 40)
    return await _read(url, DeliverPolicy.all())


async def _read(url: str, start: DeliverPolicy) -> list[ImmutableMessage]:
    async with await walsvc.open_wal(url, PCHANNEL, read_only=True) as wal:
        latest = await wal.latest_message_id()
        out: list[ImmutableMessage] = []
        async with asyncio.timeout(30), wal.read(start, raw=True) as scanner:
            async for message in scanner:
                out.append(message)
                if message.message_id == latest:
                    return out
    return out


@pytest.fixture(scope="module", params=["memory", "file"])
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[ImmutableMessage]]:
    if request.param == "memory":
        url = f"memory://{uuid.uuid4().hex}"
    else:
        url = f"file://{tmp_path_factory.mktemp('seek')}"
    return url, asyncio.run(_build(url))


async def test_start_at_timetick_includes_every_message_from_the_tick(
    built: tuple[str, list[ImmutableMessage]], seed: random.Random
) -> None:
    """For targets before, at, between and after the log's ticks: reading from the answer
    delivers every message with a tick at or above the target, and what it reads before
    the first of them is within the search's precision (about ``NEAR`` bytes), not the
    log."""
    url, log = built
    ticks = [m.timetick for m in log]
    targets = [0, ticks[0], ticks[-1], ticks[-1] + 1]
    targets += [seed.choice(ticks) + seed.choice((-1, 0, 1)) for _ in range(25)]
    async with await walsvc.open_wal(url, PCHANNEL, read_only=True) as wal:
        for target in targets:
            policy = await wal.backend.start_at_timetick(target)
            read = await _read(url, policy)
            wanted = [m.message_id for m in log if m.timetick >= target]
            got = [m.message_id for m in read if m.timetick >= target]
            assert got == wanted, target
            before = len(read) - len(got)
            assert before * (PAYLOAD + 40) <= 2 * NEAR + 400 * (PAYLOAD + 40), (target, before)


async def test_a_reopened_log_is_read_from_anywhere(
    built: tuple[str, list[ImmutableMessage]], seed: random.Random
) -> None:
    """Scanners of a reopened log (it knows no frame positions yet) start at any record,
    exact, through the binary search."""
    url, log = built
    for message in seed.sample(log[:-1], 12):
        for after in (False, True):
            policy = DeliverPolicy.start_after if after else DeliverPolicy.start_from
            read = await _read(url, policy(message.message_id))
            first = log.index(message) + after
            assert [m.message_id for m in read] == [m.message_id for m in log[first:]]


# -- what a reopened writer reads -------------------------------------------------------


async def _old_log_with_damage(root: Path, clock: FakeClock, *, keys: bool) -> str:
    """Keyed messages in four segments, then a bit flipped in the oldest segment."""
    url = f"file://{root}"
    chain = interceptors.default_chain(sync_interval=None)
    async with await walsvc.open_wal(
        url, PCHANNEL, segment_size=4096, interceptors=chain, timetick_allocator=HybridClock(clock)
    ) as wal:
        for i in range(60):
            await wal.append(data(b"x" * 200, idempotency_key=f"k{i}" if keys else None))
            clock.ms += 10  # time passes: messages name a recent last-confirmed id
    oldest = sorted(p for p in (root / PCHANNEL).iterdir() if segment_seq(p.name) is not None)[0]
    frame = whole_frames(oldest.read_bytes())[0]
    raw = bytearray(oldest.read_bytes())
    raw[frame.offset + 40] ^= 0x04
    oldest.write_bytes(bytes(raw))
    return url


async def test_damage_older_than_the_window_stops_no_append(tmp_path: Path) -> None:
    """Before: one flipped bit in the oldest of four segments made every append raise
    CorruptRecord (the dedup rebuild read the log from its start). Now the rebuild reads
    the window only: plain and keyed appends go on; reads crossing the damage report it."""
    clock = FakeClock()
    url = await _old_log_with_damage(tmp_path, clock, keys=True)
    clock.ms += 700_000  # past Dedup's default max_age of 600 s
    async with await walsvc.open_wal(url, PCHANNEL, timetick_allocator=HybridClock(clock)) as wal:
        await wal.append(data(b"plain"))
        first = await wal.append(data(b"keyed", idempotency_key="new"))
        assert await wal.append(data(b"keyed", idempotency_key="new")) == first
        assert member(wal, Dedup).rebuilt == 0
        async with asyncio.timeout(10), wal.read(use_cache=False) as scanner:
            with pytest.raises(walsvc.CorruptRecord):
                await anext(scanner)


async def test_damage_inside_the_window_stops_keyed_appends_only(tmp_path: Path) -> None:
    """Exactly-once cannot be promised over keys the window cannot read: keyed appends
    raise the damage (typed, naming the file); plain appends never wait for the rebuild."""
    clock = FakeClock()
    url = await _old_log_with_damage(tmp_path, clock, keys=True)
    async with await walsvc.open_wal(url, PCHANNEL, timetick_allocator=HybridClock(clock)) as wal:
        await wal.append(data(b"plain"))
        with pytest.raises(walsvc.CorruptRecord, match=r"\.seg"):
            await wal.append(data(b"keyed", idempotency_key="k1"))
        await wal.append(data(b"plain again"))
