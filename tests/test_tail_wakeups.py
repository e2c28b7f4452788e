"""Idle tailing scanners (issue 21, section 4): a scanner whose pipeline drops idle
TimeTicks waits for data only; idle ticks wake only the scanners that would use them.

Wake-ups are counted (returns of ``LogSource._from_cache``, each a wait that ended), never
timed; time is an injected clock and the timetick sync runs when a test says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from _chain_support import FakeClock, data, member, open_manual

from interceptors import TimetickSync
from scanners._tail_cache import TailCache
from walsvc import Checkpoint, DeliverPolicy, MessageType, Scanner
from walsvc.core._ids import SequenceMessageId
from walsvc.core._message import NO_PROPERTIES, ImmutableMessage
from walsvc.read._source import LogSource

_SCANNERS = 20
_TICKS = 50
_IDLE = ImmutableMessage(
    SequenceMessageId(1),
    5,
    "",
    MessageType.TIME_TICK,
    b"",
    NO_PROPERTIES,
    None,
    None,
    None,
    1,
    False,
    (),
    4,
)


@pytest.fixture
def wakeups(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the waits on the tail cache that ended (one per return of ``_from_cache``
    after it waited or found something)."""
    count = [0]
    original = LogSource._from_cache

    async def counted(self: LogSource) -> object:
        try:
            return await original(self)
        finally:
            count[0] += 1

    monkeypatch.setattr(LogSource, "_from_cache", counted)
    return count


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _started(scanner: Scanner) -> None:
    """Once ``scanner`` chose where it starts (a subscription: at its first read)."""
    for _ in range(5000):
        if scanner.stats().source != "not started":
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the scanner did not start")


async def _flushed_checkpoint(scanner: Scanner, above: int) -> Checkpoint:
    """The subscription's checkpoint once it is above ``above`` (the scanner handles what
    it was woken for on its own task; a file store writes in a thread)."""
    for _ in range(2000):
        await scanner.flush()
        checkpoint = scanner.stats().checkpoint
        if checkpoint is not None and checkpoint.timetick > above:
            return checkpoint
        await asyncio.sleep(0.001)
    raise AssertionError(f"the checkpoint stayed at {scanner.stats().checkpoint}")


async def test_idle_ticks_do_not_wake_scanners_that_drop_them(
    url: str, clock: FakeClock, wakeups: list[int]
) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        context = sync._context
        await wal.append(data(b"x"))
        clock.ms += 10
        assert await sync.sync_once() is not None  # persisted
        scanners = [wal.read(DeliverPolicy.latest()) for _ in range(_SCANNERS)]
        reads = [asyncio.ensure_future(anext(s)) for s in scanners]
        await _settle()  # every scanner waits at the end of the log
        assert all(s.stats().source == "cache" for s in scanners)
        assert not context.has_tick_listeners()
        before = wakeups[0]
        for _ in range(_TICKS):
            clock.ms += 10
            # Nobody would use an idle tick: the sync publishes none.
            assert await sync.sync_once() is None
            context.publish_idle_tick()  # and one published anyway wakes nobody
            await asyncio.sleep(0)
        await _settle()
        assert wakeups[0] == before
        assert not any(r.done() for r in reads)
        # Data still wakes each of them, once.
        sent = await wal.append(data(b"y"))
        got = await asyncio.gather(*reads)
        assert {m.message_id for m in got} == {sent.message_id}
        assert wakeups[0] - before <= 2 * _SCANNERS
        for scanner in scanners:
            await scanner.aclose()


async def test_scanners_that_take_ticks_still_get_idle_ticks(
    url: str, clock: FakeClock, wakeups: list[int]
) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        await wal.append(data(b"x"))
        clock.ms += 10
        await sync.sync_once()
        quiet = wal.read(DeliverPolicy.latest())
        ticking = wal.read(DeliverPolicy.latest(), timeticks=True)
        quiet_read = asyncio.ensure_future(anext(quiet))
        await _settle()
        assert not sync._context.has_tick_listeners()
        tick_read = asyncio.ensure_future(anext(ticking))
        await _settle()
        assert sync._context.has_tick_listeners()
        clock.ms += 10
        idle = await sync.sync_once()
        got = await tick_read
        assert (got.type, got.timetick, got.persisted) == (MessageType.TIME_TICK, idle, False)
        assert not quiet_read.done()
        await quiet.aclose()
        await ticking.aclose()


async def test_a_subscription_waits_for_an_idle_tick_only_while_one_would_move_it(
    url: str, clock: FakeClock
) -> None:
    """A TimeTick delivered in a batch with data is left out without moving the
    checkpoint; once the data is acknowledged, the next idle tick moves it (to the
    newest message's tick), and then the subscription waits for data only again."""
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        context = sync._context
        async with wal.read(DeliverPolicy.latest(), subscription="s") as scanner:
            first = asyncio.ensure_future(anext(scanner))
            # The subscription starts at its first read, once its store answered (on
            # file://, from a thread): only from then on is "latest" a position. An append
            # before it would be behind the start, and the read would wait for ever.
            await _started(scanner)
            await _settle()
            sent = await wal.append(data(b"x"))
            clock.ms += 10
            persisted = await sync.sync_once()  # a TimeTick right after the data
            assert persisted is not None
            message = await first
            assert message.message_id == sent.message_id
            second = asyncio.ensure_future(anext(scanner))
            await _settle()
            # The tick was left out and moved nothing (the data is not acknowledged):
            # the scanner waits for data only.
            assert not context.has_tick_listeners()
            await scanner.ack(message)  # while the read waits
            await _settle()
            assert context.has_tick_listeners()  # an idle tick would move the checkpoint
            clock.ms += 10
            assert await sync.sync_once() is not None
            checkpoint = await _flushed_checkpoint(scanner, message.timetick)
            assert checkpoint.timetick == persisted
            assert not context.has_tick_listeners()  # nothing more an idle tick would do
            assert not second.done()
            second.cancel()


async def test_a_subscription_that_acked_everything_takes_no_idle_ticks(
    url: str, clock: FakeClock
) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        context = sync._context
        sent = await wal.append(data(b"x"))
        async with wal.read(
            DeliverPolicy.start_after(sent.message_id), subscription="t"
        ) as scanner:
            clock.ms += 10
            await sync.sync_once()  # a TimeTick alone: it moves the checkpoint itself
            read = asyncio.ensure_future(anext(scanner))
            await _flushed_checkpoint(scanner, sent.timetick)
            await _settle()
            assert not context.has_tick_listeners()
            read.cancel()


async def test_a_raw_reader_is_a_tick_listener(url: str, clock: FakeClock) -> None:
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        await wal.append(data(b"x"))
        clock.ms += 10
        await sync.sync_once()
        async with wal.read(DeliverPolicy.latest(), raw=True) as scanner:
            read = asyncio.ensure_future(anext(scanner))
            await _settle()
            assert sync._context.has_tick_listeners()
            clock.ms += 10
            idle = await sync.sync_once()
            got = await read
            assert (got.timetick, got.persisted) == (idle, False)


async def test_tail_cache_wakes_tick_waiters_only_for_idle_ticks() -> None:
    """Idle ticks resolve tick waiters only; ``wake`` resolves both kinds; a data waiter
    can be made a tick waiter while it waits."""
    cache = TailCache(max_bytes=1 << 20, max_age=10.0)
    data_only = cache.waiter(ticks=False)
    ticks = cache.waiter(ticks=True)
    assert cache.has_waiters()
    assert cache.has_tick_waiters()
    cache.publish_idle_tick(_IDLE)
    assert ticks.done()
    assert not data_only.done()
    assert not cache.has_tick_waiters()
    cache.want_ticks(data_only)
    assert cache.has_tick_waiters()
    cache.wake()
    assert data_only.done()
    assert not cache.has_waiters()
