"""Timetick sync: the opening tick, persisted and idle ticks, last-confirmed ids.
Time is an injected clock; no test sleeps to wait for a timer."""

from __future__ import annotations

import asyncio
import uuid

import _faulty
import pytest
from _chain_support import FakeClock, data, log_of, member, open_manual

import walsvc
from interceptors import TimetickSync, _timetick
from walsvc import DeliverPolicy, MessageType

_faulty.register()


async def test_open_writes_a_timetick_and_ticks_increase_across_restarts(
    url: str, clock: FakeClock
) -> None:
    ticks: list[int] = []
    for round_ in range(3):
        async with await open_manual(url, clock) as wal:
            await wal.append(data(b"r%d" % round_))
            await wal.append_many([data(b"a"), data(b"b")])
        clock.ms -= 60_000  # the wall clock steps back between restarts
    async with await walsvc.open_wal(url, "p0", read_only=True) as wal:
        log = await log_of(wal)
    ticks = [m.timetick for m in log]
    assert ticks == sorted(ticks)
    assert len(set(ticks)) == len(ticks)
    kinds = [m.type for m in log]
    assert kinds.count(MessageType.TIME_TICK) == 3  # one per open
    assert kinds[0] is MessageType.TIME_TICK


async def test_sync_persists_only_after_appends_and_idle_ticks_reach_tailing_readers(
    url: str, clock: FakeClock
) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        assert await sync.sync_once() is None  # nothing appended, nobody listening
        sent = await wal.append(data(b"x"))
        clock.ms += 10
        persisted = await sync.sync_once()
        assert persisted is not None
        assert persisted > sent.timetick
        async with wal.read(DeliverPolicy.start_after(sent.message_id), timeticks=True) as scanner:
            tick = await anext(scanner)
            assert (tick.type, tick.timetick, tick.persisted) == (
                MessageType.TIME_TICK,
                persisted,
                True,
            )
            latest = await wal.latest_message_id()
            waiting = asyncio.ensure_future(anext(scanner))
            await asyncio.sleep(0)  # the scanner is now waiting at the end of the log
            clock.ms += 10
            idle = await sync.sync_once()
            got = await waiting
        assert idle is not None
        assert idle > persisted
        assert (got.timetick, got.persisted, got.message_id) == (idle, False, latest)
        assert got.last_confirmed_id is not None
        assert await wal.latest_message_id() == latest  # idle ticks are not written


async def test_every_message_carries_a_last_confirmed_id_at_or_before_itself(url: str) -> None:
    async with await walsvc.open_wal(url, "p0") as wal:
        results = [await wal.append(data(b"%d" % i)) for i in range(5)]
        results += await wal.append_many([data(b"m")] * 3)
        log = await log_of(wal)
    for result in results:
        assert result.last_confirmed_id is not None
        assert result.last_confirmed_id < result.message_id
    for message in log[1:]:
        assert message.last_confirmed_id is not None
        assert message.last_confirmed_id < message.message_id


async def test_the_timer_persists_a_tick_after_appends() -> None:
    """The real timer (10 ms): a tailing reader gets a persisted TimeTick after data."""
    async with await walsvc.open_wal(f"memory://{uuid.uuid4().hex}", "p") as wal:
        sent = await wal.append(data(b"x"))
        async with wal.read(DeliverPolicy.start_after(sent.message_id), timeticks=True) as scanner:
            async with asyncio.timeout(10):
                tick = await anext(scanner)
        assert tick.type is MessageType.TIME_TICK
        assert tick.persisted
        assert tick.timetick > sent.timetick


def test_sync_interval_is_validated() -> None:
    for bad in (0, -1, float("nan"), True, "10ms"):
        with pytest.raises(ValueError, match="interval"):
            TimetickSync(bad)  # type: ignore[arg-type]


async def test_a_timetick_waits_for_a_burst_of_appends_to_end(url: str) -> None:
    """The timer persists a TimeTick once a visit finds nothing appended since the one
    before, or after MAX_DEFERRALS visits under a steady stream: a producer appending
    every interval writes one TimeTick per ten messages, not one per message. The timer
    is driven by hand (an interval of an hour never fires by itself)."""
    sync = TimetickSync(3600.0)
    async with await walsvc.open_wal(url, "p0", interceptors=[sync]) as wal:
        await wal.wait_ready()
        ticker = _timetick._tickers[(asyncio.get_running_loop(), 3600.0)]

        async def persisted_ticks() -> int:
            log = await log_of(wal)
            return sum(m.type is MessageType.TIME_TICK for m in log) - 1  # the opening one

        async def visit() -> None:
            ticker.fire()
            if sync._persisting is not None:
                await sync._persisting

        await wal.append(data(b"one"))
        await visit()
        assert await persisted_ticks() == 0  # appended since the last visit: it waits
        await visit()
        assert await persisted_ticks() == 1  # the burst is over
        for i in range(2 * (_timetick.MAX_DEFERRALS + 1)):
            await wal.append(data(b"%d" % i))
            await visit()
        assert await persisted_ticks() == 3  # one per MAX_DEFERRALS + 1 visits
        await visit()
        await visit()
        assert await persisted_ticks() == 3  # nothing new since the last one
        log = await log_of(wal)
        assert log[-1].type is MessageType.TIME_TICK
        assert [m.timetick for m in log] == sorted(m.timetick for m in log)


async def test_a_reader_started_past_an_idle_tick_never_gets_it(url: str, clock: FakeClock) -> None:
    """An idle tick names the newest message when it was published; a scanner that
    starts after a later message must not deliver it (its tick is older than that
    message's): it waits for a tick that confirms where it is."""
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        async with wal.read(DeliverPolicy.latest(), timeticks=True) as tailing:
            waiting = asyncio.ensure_future(anext(tailing))
            await asyncio.sleep(0)
            clock.ms += 10
            stale = await sync.sync_once()  # an idle tick naming the opening TimeTick
            assert (await waiting).timetick == stale
            sent = await wal.append(data(b"x"))
            assert stale is not None
            assert sent.timetick > stale
            for policy in (DeliverPolicy.start_after(sent.message_id), DeliverPolicy.latest()):
                async with wal.read(policy, timeticks=True) as scanner:
                    got = asyncio.ensure_future(anext(scanner))
                    await asyncio.sleep(0.01)
                    assert not got.done(), f"{policy}: delivered {got.result()!r}"
                    clock.ms += 10
                    persisted = await sync.sync_once()
                    tick = await asyncio.wait_for(got, 5)
                    assert tick.timetick == persisted
                    assert tick.timetick > sent.timetick


async def test_a_timetick_that_failed_transiently_is_tried_again_after_a_backoff() -> None:
    """The backend is away when the timer persists a TimeTick: the sync waits one visit,
    then two, ... and persists it once the backend answers (before: the first failure
    stopped the sync of that WAL for good). The timer is driven by hand."""
    sync = TimetickSync(3600.0)
    url = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "tick-backoff", interceptors=[sync]) as wal:
        await wal.wait_ready()
        ticker = _timetick._tickers[(asyncio.get_running_loop(), 3600.0)]
        tried: list[bool] = []

        async def visit() -> None:
            ticker.fire()
            persisting = sync._persisting
            tried.append(persisting is not None)
            if persisting is not None:
                await persisting

        await wal.append(data(b"one"))
        _faulty.FaultyBackend.faults["tick-backoff"] = ["unavailable", "lost-ack", "ok"]
        for _ in range(12):
            await visit()
        log = await log_of(wal)
    # failed, (a visit skipped), failed, (two skipped), persisted, and nothing since; a
    # failed append took a tick, so a visit may also wait for that "burst" to end
    tries = [visit for visit, tried_then in enumerate(tried) if tried_then]
    assert len(tries) == 3, tried
    assert tries[1] - tries[0] >= 2, tried
    assert tries[2] - tries[1] >= 3, tried
    ticks = [m for m in log if m.type is MessageType.TIME_TICK]
    assert len(ticks) == 3  # the opening one, the one a lost ack wrote, the last
    assert sync._backoff == 0
