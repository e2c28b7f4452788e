"""``KafkaBackend.start_at_timetick``: where a read must start to include every message
from a timetick on, against a real broker (Tansu, see _tansu.py)."""

from __future__ import annotations

import asyncio
import random

from _seek_check import check_start_at_timetick
from _tansu import fresh, raw_copy, tansu_url

import walsvc
from walsvc import Message

__all__ = ("tansu_url",)


async def build_log(url: str, pchannel: str) -> walsvc.MessageId:
    """About 3000 messages in batches of 1 to 64 from several producers, across two
    writers (a barrier between them), with invalid records among them (stragglers: copies
    of earlier records that land elsewhere, with old timeticks). Returns the last id."""
    last: walsvc.MessageId | None = None
    for writer in range(2):
        async with await walsvc.open_wal(url, pchannel) as wal:

            async def produce(k: int, wal: walsvc.WAL = wal, writer: int = writer) -> None:
                for i in range(12):
                    size = 1 + (k * 7 + i * 13) % 64
                    messages = [
                        Message(payload=b"w%d-p%d-%d-%d" % (writer, k, i, j), vchannel="v")
                        for j in range(size)
                    ]
                    await wal.append_many(messages)

            await asyncio.gather(*(produce(k) for k in range(4)))
            sent = await wal.append(Message(payload=b"middle", vchannel="v"))
            await raw_copy(url, pchannel, sent.message_id)  # an invalid record, old tick
            await asyncio.gather(*(produce(k) for k in range(4, 8)))
            last = (await wal.append(Message(payload=b"end", vchannel="v"))).message_id
    assert last is not None
    return last


async def test_a_read_from_start_at_timetick_misses_nothing_and_reads_little(
    tansu_url: str, seed: random.Random
) -> None:
    """For random targets (below, inside and above the log's ticks), a read from the
    policy delivers every message with a tick at or above the target, and nothing below
    it (if there is none, the newest message alone): the search lands right after the
    last valid message below the target, however invalid records, barriers and
    TimeTicks lie around it. (The default, ``all``, reads the whole log.)"""
    pchannel = fresh()
    await build_log(tansu_url, pchannel)
    await check_start_at_timetick(tansu_url, pchannel, seed)
