"""The broker ``start_at_timetick`` check shared by test_kafka_seek and test_pulsar_seek:
for random targets, a read from the policy delivers exactly the messages at or above the
target (the newest message alone if there is none)."""

from __future__ import annotations

import asyncio
import random

import walsvc
from walsvc import DeliverPolicy

#: Seconds a read of the test log may take before the check calls it a hang.
HANG = 60.0


async def read_ticks(
    wal: walsvc.WAL, deliver: DeliverPolicy, through: walsvc.MessageId
) -> list[tuple[walsvc.MessageId, int]]:
    """(id, timetick) of every message (system ones too) delivered from ``deliver``
    through ``through``, by the backend alone."""
    out: list[tuple[walsvc.MessageId, int]] = []
    async with asyncio.timeout(HANG), wal.read(deliver, raw=True, use_cache=False) as scanner:
        async for message in scanner:
            out.append((message.message_id, message.timetick))
            if message.message_id >= through:
                return out
    raise AssertionError("scanner ended")


async def check_start_at_timetick(url: str, pchannel: str, seed: random.Random) -> None:
    """On the log of ``pchannel`` (more than 2000 messages), for targets below, inside
    and above its ticks: a read from ``start_at_timetick(target)`` delivers every message
    with a tick at or above the target and nothing below it; if there is none, the newest
    message alone."""
    async with await walsvc.open_wal(url, pchannel, read_only=True) as wal:
        last = await wal.latest_message_id()  # the last TimeTick, perhaps
        assert last is not None
        everything = await read_ticks(wal, DeliverPolicy.all(), last)
        ticks = [tick for _, tick in everything]
        assert ticks == sorted(ticks)
        assert len(ticks) > 2000
        targets = [0, ticks[0], ticks[0] + 1, ticks[-1], ticks[-1] + 1]
        targets += [seed.choice(ticks) + seed.choice((-1, 0, 1)) for _ in range(25)]
        for target in targets:
            policy = await wal.backend.start_at_timetick(target)
            wanted = [entry for entry in everything if entry[1] >= target]
            got = await read_ticks(wal, policy, last)
            if wanted:
                below = [entry for entry in got if entry[1] < target]
                assert not below, (target, policy, below[:3])
                assert got == wanted, (target, policy)
            else:  # none at or above: the read holds the newest message, and no other
                assert got == everything[-1:], (target, policy, got[:3])
