"""The read pipeline's paths that the property tests (tests/test_scanner_properties.py,
tests/test_scanner_fault_properties.py) must take, spelled out one by one (a reader behind
the cache, one that falls out of it, subscriptions around idle ticks and restarts), and
the reproducers of what they found."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, Final

import pytest
from _chain_support import FakeClock, open_manual, whole_log

import scanners
import walsvc
from interceptors import TimetickSync
from walsvc import DeliverPolicy, ImmutableMessage, Message, MessageType
from walsvc.backends._file._subscriptions import FileSubscriptionStore

_TIMEOUT: Final = 5.0  # a reader that makes no progress for this long is a bug


async def test_a_reader_behind_reads_the_backend_then_hands_off_to_the_cache() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p", interceptors=[]) as wal:
        ids = [(await wal.append(Message(payload=b"0", vchannel="v1"))).message_id]
        ids += [
            r.message_id
            for r in await wal.append_many(
                [Message(payload=b"%d" % i, vchannel="v1") for i in range(1, 5)]
            )
        ]
        async with wal.read(DeliverPolicy.all(), [scanners.vchannel("v1")]) as scanner:
            assert scanner.stats().source == "backend"
            got = [await _next(scanner) for _ in range(5)]
            more = await wal.append(Message(payload=b"5", vchannel="v1"))
            got.append(await _next(scanner))
            stats = scanner.stats()
    assert [m.message_id for m in got] == [*ids, more.message_id]
    assert (stats.source, stats.handoffs, stats.fallbacks) == ("cache", 1, 0)


async def test_a_reader_that_falls_out_of_the_cache_continues_from_the_backend() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p", interceptors=[], tail_cache_bytes=2000) as wal:
        async with wal.read(DeliverPolicy.latest()) as scanner:
            first = await wal.append(Message(payload=b"0", vchannel="v1"))
            assert (await _next(scanner)).message_id == first.message_id
            assert scanner.stats().source == "cache"
            # While the reader waits, 30 entries of ~250 bytes go through a 2000-byte cache.
            rest = [
                (await wal.append(Message(payload=b"%d" % i, vchannel="v1"))).message_id
                for i in range(1, 31)
            ]
            assert wal.cache_stats().evicted > 0  # type: ignore[union-attr]
            got = [(await _next(scanner)).message_id for _ in rest]
            assert scanner.stats().fallbacks == 1
            # Caught up, the next read waits, and hands off to the cache meanwhile.
            waiting = asyncio.ensure_future(_next(scanner))
            await asyncio.sleep(0)
            rest.append((await wal.append(Message(payload=b"31", vchannel="v1"))).message_id)
            got.append((await waiting).message_id)
            stats = scanner.stats()
    assert got == rest  # no gap, no duplicate
    assert (stats.source, stats.handoffs, stats.fallbacks) == ("cache", 1, 1)


@pytest.mark.parametrize("closed_by", ["scanner", "wal"])
async def test_a_subscription_scanner_closed_while_loading_its_checkpoint_delivers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closed_by: str
) -> None:
    """Found by the property (file://): the WAL closed a subscription scanner whose first
    read was still loading the stored checkpoint (in a worker thread); the read then
    opened a source anyway and delivered messages after the close, acked into a
    checkpoint writer nobody flushed, so the next reader of the subscription got them
    again. The same holds for ``Scanner.aclose``."""
    loaded = asyncio.Event()
    load = FileSubscriptionStore._load

    async def load_and_tell(self: FileSubscriptionStore, name: str) -> walsvc.Checkpoint | None:
        try:
            return await load(self, name)
        finally:
            loaded.set()

    monkeypatch.setattr(FileSubscriptionStore, "_load", load_and_tell)
    url = f"file://{tmp_path / 'log'}"
    wal = await walsvc.open_wal(url, "p", interceptors=[])
    backend_aclose = type(wal.backend).aclose

    async def slow_aclose(self: Any) -> None:
        # As when other scanners' checkpoint flushes keep the WAL's close busy: the
        # load finishes before the backend closes.
        await loaded.wait()
        await backend_aclose(self)

    monkeypatch.setattr(type(wal.backend), "aclose", slow_aclose)
    try:
        await wal.append(Message(payload=b"a", vchannel="v1"))
        scanner = wal.read(subscription="s")
        first = asyncio.ensure_future(anext(scanner))
        await asyncio.sleep(0)  # the first read now waits for the stored checkpoint
        assert scanner.stats().source == "not started"
        assert not loaded.is_set()
        if closed_by == "scanner":
            await scanner.aclose()
            with pytest.raises(StopAsyncIteration):
                await first
        else:
            await wal.aclose()
            with pytest.raises(walsvc.WALClosed):
                await first
        assert scanner.stats().source == "not started"
    finally:
        await wal.aclose()


async def _next(scanner: walsvc.Scanner) -> ImmutableMessage:
    return await asyncio.wait_for(anext(scanner), _TIMEOUT)


async def _idle_tick_then_restart(
    url: str, clock: FakeClock, subscription: str | None
) -> tuple[ImmutableMessage, walsvc.WAL]:
    """A writer appends, persists a TimeTick, then publishes an idle tick that a scanner
    (of ``subscription``, which acks it) receives; then the writer closes and a new one
    opens in the same millisecond (or on a clock a little behind: another node)."""
    wal = await open_manual(url, clock, pchannel="p")
    sync = next(m for m in wal.interceptors if isinstance(m, TimetickSync))
    await wal.append(Message(payload=b"a", vchannel="v1"))
    await sync.sync_once()  # persists a TimeTick
    newest = await wal.latest_message_id()
    async with wal.read(subscription=subscription, timeticks=True) as scanner:
        while (await _next(scanner)).message_id != newest:
            pass
        waiting = asyncio.ensure_future(_next(scanner))
        # Nothing appended since the TimeTick: once the scanner waits, an idle tick.
        for _ in range(100):
            if await sync.sync_once() is not None:
                break
            await asyncio.sleep(0)
        idle = await waiting
        assert not idle.persisted
        if subscription is not None:
            await scanner.ack(idle)
    await wal.aclose()
    return idle, await open_manual(url, clock, pchannel="p")


async def test_an_acked_idle_tick_does_not_make_the_subscription_skip_the_next_writer() -> None:
    """Found by the property: idle ticks are allocated but never written, so the next
    writer (recovering its tick floor from the log) may give its first messages ticks at
    or below an idle tick a reader acked; the subscription then resumed above the idle
    tick and skipped them."""
    url = f"memory://{uuid.uuid4().hex}"
    idle, wal = await _idle_tick_then_restart(url, FakeClock(), "s")
    async with wal:
        assert (await wal.latest_message_id()) is not None
        opening = (await whole_log(url, "p"))[-1]
        assert opening.type is MessageType.TIME_TICK
        assert opening.timetick <= idle.timetick  # the new writer reused the idle tick
        appended = await wal.append(Message(payload=b"b", vchannel="v1"))
        async with wal.read(subscription="s", timeticks=True) as scanner:
            first = await _next(scanner)
            assert first.message_id == opening.message_id, first  # not skipped
            assert (await _next(scanner)).message_id == appended.message_id


async def test_resuming_from_an_idle_ticks_checkpoint_after_a_restart_skips_nothing() -> None:
    """Found by the property: ``from_checkpoint(idle.checkpoint)`` skips the next writer's
    first messages when their ticks are at or below the idle tick (a restart within the
    same millisecond, or a new writer whose clock is a little behind)."""
    url = f"memory://{uuid.uuid4().hex}"
    idle, wal = await _idle_tick_then_restart(url, FakeClock(), None)
    async with wal:
        opening = (await whole_log(url, "p"))[-1]
        await wal.append(Message(payload=b"b", vchannel="v1"))
        async with wal.read(
            DeliverPolicy.from_checkpoint(idle.checkpoint), timeticks=True
        ) as scanner:
            first = await _next(scanner)
    assert first.message_id == opening.message_id, first
