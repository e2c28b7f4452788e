"""``PulsarBackend.start_at_timetick``: where a read must start to include every message
from a timetick on, against a real broker (Pulsar Lite, see _pulsar_lite.py)."""

from __future__ import annotations

import asyncio
import random

import pytest
from _pulsar_lite import PulsarLite, broker, data, pchannel
from _seek_check import check_start_at_timetick

import walsvc

__all__ = ("broker",)


async def build_log(url: str, pch: str) -> walsvc.MessageId:
    """About 3000 messages in groups of 1 to 64 from several producers (entries of at most
    50 messages), across two writers (a barrier between them), with invalid messages
    among them: the old writer's straggler after the new writer's barrier, and the new
    writer's first group, displaced by it and sent again. Returns the last id."""
    options = {"batching_max_messages": 50}

    async def produce(wal: walsvc.WAL, label: str, producers: range) -> None:
        async def one(k: int) -> None:
            for i in range(12):
                size = 1 + (k * 7 + i * 13) % 64
                await wal.append_many([data(f"{label}{k}-{i}", j) for j in range(size)])

        await asyncio.gather(*(one(k) for k in producers))

    old = await walsvc.open_wal(url, pch, **options)
    try:
        await produce(old, "old", range(4))
        bare = await walsvc.open_wal(url, pch, interceptors=[], **options)
        try:
            async with await walsvc.open_wal(url, pch, **options) as new:
                with pytest.raises(walsvc.WALFenced):
                    await bare.append(data("straggler", 0))
                await produce(new, "new", range(4, 8))
                last = (await new.append(data("end", 0))).message_id
        finally:
            await bare.aclose()
    finally:
        await old.aclose()
    return last


async def test_a_read_from_start_at_timetick_misses_nothing_and_reads_little(
    broker: PulsarLite, seed: random.Random
) -> None:
    """For random targets (below, inside and above the log's ticks), a read from the
    policy delivers every message with a tick at or above the target, and nothing below
    it (if there is none, the newest message alone): the search lands right after the
    last valid message below the target, however invalid records, barriers and
    TimeTicks lie around it. (The default, ``all``, reads the whole log.)"""
    pch = pchannel()
    await build_log(broker.url, pch)
    await check_start_at_timetick(broker.url, pch, seed)
