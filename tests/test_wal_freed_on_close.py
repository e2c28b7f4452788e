"""A closed WAL is freed when its last reference goes, not at the cycle collector's next
pass: its interceptors refer back to it weakly (``WALContext``), so that a closed WAL
with a big dedup window and tail cache does not wait, and hold its memory, for a pass
that then takes seconds over it."""

from __future__ import annotations

import gc
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

import walsvc
from walsvc import DeliverPolicy, Message


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("scheme", ["memory", "file"])
async def test_a_closed_wal_is_freed_by_its_last_reference(
    scheme: str, tmp_path: Path, collector_off: None
) -> None:
    url = f"memory://freed-{uuid.uuid4().hex[:8]}" if scheme == "memory" else f"file://{tmp_path}"
    wal = await walsvc.open_wal(url, "p0")
    await wal.append_many(
        [Message(payload=b"%d" % i, vchannel="v", idempotency_key=f"k{i}") for i in range(50)]
    )
    async with wal.txn("v") as txn:
        await txn.append(Message(payload=b"t", vchannel="v"))
    async with wal.read(DeliverPolicy.all()) as scanner:
        await anext(aiter(scanner))
    await wal.aclose()
    freed = weakref.ref(wal)
    del wal, txn, scanner  # each refers to its WAL, as it may
    assert freed() is None, [type(r).__name__ for r in gc.get_referrers(freed())]
