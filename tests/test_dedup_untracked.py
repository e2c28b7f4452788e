"""The dedup window is nothing the cycle collector reads: its table holds only str keys,
``AppendResult``s and ``Entry``s, and its runs are ``Run``s of tuples of those, none of
them tracked, so the table is not tracked either, and a collection of a window of a
million keys does not hold the loop. That needs an ``Entry`` (and a ``Run``) in no
reference cycle: an entry drops its owner once the owner is done."""

from __future__ import annotations

import asyncio
import gc
import uuid

import walsvc
from interceptors import Dedup, default_chain
from interceptors._dedup_slots import Entry
from walsvc import Message


def _tables(slots: object) -> list[dict[object, object]]:
    """The dicts that hold the window (a ``ShardedDict``'s shards, or one dict)."""
    if isinstance(slots, dict):
        return [slots]
    return [t for t in gc.get_referents(slots) if isinstance(t, dict)]


async def test_the_window_table_is_never_tracked_and_entries_drop_their_owners() -> None:
    dedup = Dedup(max_keys=500)
    wal = await walsvc.open_wal(
        f"memory://untracked-{uuid.uuid4().hex[:8]}",
        "p0",
        interceptors=lambda: default_chain(dedup=dedup, sync_interval=None),
    )
    try:
        for first in range(0, 1000, 50):  # fills, then churns, the window
            batch = [
                Message(payload=b"x", vchannel="v", idempotency_key=f"k{i}")
                for i in range(first, first + 50)
            ]
            await asyncio.gather(wal.append_many(batch), wal.append(batch[0]))
        for first in range(0, 600, 100):  # counted keys: runs, which churn the window too
            counted = [
                Message(payload=b"x", vchannel="v", idempotency_key=f"~p.{i:x}")
                for i in range(first, first + 100)
            ]
            await wal.append_many(counted)
        async with wal.txn("v", idempotency_key="t1") as txn:
            await txn.append(Message(payload=b"t", vchannel="v"))
        await asyncio.sleep(0)  # the owners' done callbacks
        window = dedup._keys
        tables = _tables(window.slots)
        assert tables
        # Each shard also holds a key of the module's own, not a str (so that its
        # entries keep their hashes: see _cshards.c): the window's keys are the rest.
        keys = [k for t in tables for k in t if isinstance(k, str | tuple)]
        general_keys = 0 if isinstance(window.slots, dict) else len(tables)
        assert len(keys) == len(window.slots) == sum(len(t) for t in tables) - general_keys
        gc.collect()
        assert not any(gc.is_tracked(t) for t in tables)
        entries = [s for s in map(window.slots.get, window.order) if isinstance(s, Entry)]
        assert entries, "the transaction's key is an Entry"
        assert all(e.owner is None for e in entries)
        runs = [run for runs in window.runs.by_stem.values() for run in runs]
        assert runs, "the last counted batches are runs"
        assert not any(gc.is_tracked(r) or gc.is_tracked(r.results) for r in runs)
        assert all(r.entry.owner is None for r in runs)
    finally:
        await wal.aclose()
