"""The records of a ``memory://`` log (``_memory._Records``: chunks of ``CHUNK``) answer
as one list of them would, through any sequence of appends and truncations, across
chunk edges; and a ``memory://`` WAL reads them back whole after both."""

from __future__ import annotations

import asyncio
import bisect
import gc
import random
import uuid

import walsvc
from walsvc import DeliverPolicy, Message
from walsvc.backends._memory import CHUNK, _Records


def _check(records: _Records, model: list[bytes], rng: random.Random) -> None:
    assert len(records) == len(model)
    for _ in range(20):
        if not model:
            break
        start = rng.randrange(len(model))
        end = rng.randrange(start, min(len(model), start + 3 * CHUNK) + 1)
        assert records.run(start, end) == model[start:end]
        assert records[start] == model[start]
    if model:
        assert records[len(model) - 1] == model[-1]
        assert records.run(0, len(model)) == model
        probe = model[rng.randrange(len(model))]
        assert bisect.bisect_left(records, probe) == bisect.bisect_left(model, probe)


def test_records_answer_as_one_list_through_appends_and_truncations(seed: random.Random) -> None:
    records, model, next_value = _Records(), list[bytes](), 0
    sizes = (1, 7, 100, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5)
    for _ in range(60):
        if model and seed.random() < 0.3:
            count = seed.choice((1, seed.randrange(len(model) + 1), len(model)))
            records.drop_front(count)
            del model[:count]
        else:
            size = seed.choice(sizes)
            batch = [v.to_bytes(8, "big") for v in range(next_value, next_value + size)]
            next_value += size
            records.extend(batch)
            model += batch
        _check(records, model, seed)


async def test_a_memory_wal_reads_back_a_log_of_many_chunks_after_a_truncation() -> None:
    wal = await walsvc.open_wal(f"memory://records-{uuid.uuid4().hex[:8]}", "p0", interceptors=[])
    try:
        batch = [Message(payload=b"%d" % i, vchannel="v") for i in range(1000)]
        acked = []
        for _ in range((3 * CHUNK) // len(batch) + 1):
            acked += await wal.append_many(batch)
        await wal.truncate(acked[CHUNK + 10].message_id)
        kept = acked[CHUNK + 11 :]
        got = []
        async with asyncio.timeout(30), wal.read(DeliverPolicy.all()) as scanner:
            async for message in scanner:
                got.append(message.message_id)
                if message.message_id == kept[-1].message_id:
                    break
        assert got == [a.message_id for a in kept]
    finally:
        await wal.aclose()


def test_the_collector_stops_tracking_full_chunks_once_it_has_read_them() -> None:
    records = _Records()
    records.extend([b"%d" % i for i in range(3 * CHUNK + 5)])
    gc.collect()
    tracked = [gc.is_tracked(chunk) for chunk in records._chunks]
    assert tracked == [False, False, False, True]  # the newest, a list, is appended to
