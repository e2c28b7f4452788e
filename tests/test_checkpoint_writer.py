"""The throttled, forward-only ``CheckpointWriter`` over a ``SubscriptionStore``:
forward only from its start, throttled writes, one write in flight, flushing and closing,
failed writes (raised once, kept pending, retried) and its arguments.

The concurrency tests use ``GatedStore``, a real memory store whose saves wait for the
test to let them through; the failed writes are a failing ``os.replace`` under a
``file://`` store's save, or an error ``GatedStore`` is told to raise.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from _store_support import checkpoint_at, fail_replace_once, saved_file

from walsvc import BackendUnavailable, InvalidArgument, WALClosed
from walsvc.backends._memory import MemorySubscriptionStore
from walsvc.backends._subscriptions import StoredSubscription, SubscriptionStore
from walsvc.read._checkpoints import CheckpointWriter


async def _until(condition: Callable[[], bool], within: float = 5) -> None:
    """Wait until ``condition()`` holds: the writer's background work offers no event to
    wait on, and adding one only for tests would widen its API."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.002)


class GatedStore(SubscriptionStore):
    """A memory store whose saves wait for ``gate``; counts saves in flight and can be told
    to fail the next save with an exception."""

    def __init__(self) -> None:
        self.inner = MemorySubscriptionStore(uuid.uuid4().hex, "p")
        super().__init__(("gated", id(self)))
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_next: Exception | None = None

    async def _load(self, name: str) -> StoredSubscription | None:
        return await self.inner.load_stored(name)

    async def _save(self, name: str, stored: StoredSubscription) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            failure, self.fail_next = self.fail_next, None
            if failure is not None:
                raise failure
            await self.inner.save(name, stored.checkpoint, stored.scope)
        finally:
            self.in_flight -= 1

    async def _delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def _names(self) -> list[str]:
        return await self.inner.names()


def _has_pending(writer: CheckpointWriter) -> Callable[[], bool]:
    return lambda: writer.pending is not None


def _memory_store() -> MemorySubscriptionStore:
    return MemorySubscriptionStore(uuid.uuid4().hex, "p")


async def test_the_writer_is_forward_only_from_its_start() -> None:
    store = _memory_store()
    await store.save("s", checkpoint_at(10))
    start = await store.load("s")
    writer = CheckpointWriter(store, "s", interval=0.05, start=start)
    assert writer.written == checkpoint_at(10)
    writer.note(checkpoint_at(5))  # older than the stored checkpoint
    writer.note(checkpoint_at(10))  # equal
    assert (writer.pending, writer.writes) == (None, 0)
    writer.note(checkpoint_at(12))
    writer.note(checkpoint_at(11))
    writer.note(checkpoint_at(12))
    await writer.flush()
    assert writer.written == checkpoint_at(12)
    assert await store.load("s") == checkpoint_at(12)
    writer.note(checkpoint_at(3))
    await writer.aclose()
    assert await store.load("s") == checkpoint_at(12)
    assert writer.writes == 1


async def test_writes_are_throttled_and_the_last_note_is_written_without_another() -> None:
    store = _memory_store()
    writer = CheckpointWriter(store, "s", interval=0.05)
    notes = 60
    for tick in range(1, notes + 1):
        writer.note(checkpoint_at(tick))
        await asyncio.sleep(0.002)
    assert 1 <= writer.writes < notes
    # The newest note is written once the quiet period ends: no note, no flush.
    await _until(lambda: writer.written == checkpoint_at(notes))
    assert await store.load("s") == checkpoint_at(notes)
    assert writer.pending is None
    writes = writer.writes
    await asyncio.sleep(0.12)
    assert writer.writes == writes, "nothing to write, nothing written"
    await writer.aclose()
    assert writer.writes == writes


async def test_one_write_in_flight_and_flush_waits_for_it() -> None:
    store = GatedStore()
    writer = CheckpointWriter(store, "s", interval=0)
    store.gate.clear()
    writer.note(checkpoint_at(1))  # starts a write, held at the gate
    await _until(lambda: store.in_flight == 1)
    for tick in range(2, 20):
        writer.note(checkpoint_at(tick))
    assert writer.pending == checkpoint_at(19)
    flushing = asyncio.create_task(writer.flush())
    await asyncio.sleep(0.01)
    assert not flushing.done(), "flush waits for the write in flight"
    assert store.most_in_flight == 1
    store.gate.set()
    await flushing
    assert store.most_in_flight == 1
    assert writer.written == checkpoint_at(19)
    assert await store.load("s") == checkpoint_at(19)
    assert writer.writes == 2
    await writer.aclose()


async def test_aclose_flushes_the_pending_checkpoint_and_then_refuses_notes() -> None:
    store = _memory_store()
    writer = CheckpointWriter(store, "s", interval=3600)
    writer.note(checkpoint_at(1))  # written at once
    writer.note(checkpoint_at(2))  # waits for the interval
    await asyncio.sleep(0.01)
    assert writer.pending == checkpoint_at(2)
    await writer.aclose()
    assert await store.load("s") == checkpoint_at(2)
    assert writer.written == checkpoint_at(2)
    assert writer.writes == 2
    assert writer.pending is None
    await writer.aclose()  # idempotent
    await writer.flush()  # nothing left to do
    with pytest.raises(WALClosed):
        writer.note(checkpoint_at(3))
    assert await store.load("s") == checkpoint_at(2)


async def test_a_failed_background_write_is_raised_by_the_next_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path = await saved_file(tmp_path, checkpoint_at(1))
    writer = CheckpointWriter(store, "s", interval=0.01, start=checkpoint_at(1))
    fail_replace_once(monkeypatch)
    writer.note(checkpoint_at(2))
    await _until(lambda: writer.pending is not None)  # the write failed; kept pending
    assert writer.pending == checkpoint_at(2)
    with pytest.raises(BackendUnavailable, match="cannot write checkpoint file") as caught:
        writer.note(checkpoint_at(3))
    assert isinstance(caught.value.__cause__, OSError)
    # That note still counted, and nothing was lost: the newest is written.
    await writer.flush()
    assert await store.load("s") == checkpoint_at(3)
    assert writer.written == checkpoint_at(3)
    writer.note(checkpoint_at(4))  # the error was raised once
    await writer.aclose()
    assert await store.load("s") == checkpoint_at(4)
    assert sorted(p.name for p in path.parent.iterdir()) == ["s"]


async def test_a_failed_background_write_is_raised_by_flush_and_by_aclose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = await saved_file(tmp_path, checkpoint_at(1))
    for finish in ("flush", "aclose"):
        writer = CheckpointWriter(store, "s", interval=0.01)
        fail_replace_once(monkeypatch)
        tick = 10 if finish == "flush" else 20
        writer.note(checkpoint_at(tick))
        await _until(_has_pending(writer))
        with pytest.raises(BackendUnavailable):
            await getattr(writer, finish)()
        # The call retried the failed checkpoint before raising: it is durable now.
        assert await store.load("s") == checkpoint_at(tick)
        await writer.aclose()
        await writer.flush()


async def test_a_failed_flush_raises_its_own_error_and_can_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = await saved_file(tmp_path, checkpoint_at(1))
    writer = CheckpointWriter(store, "s", interval=3600, start=checkpoint_at(1))
    writer.note(checkpoint_at(2))  # written at once
    await writer.flush()
    writer.note(checkpoint_at(3))  # waits for the interval
    fail_replace_once(monkeypatch)
    with pytest.raises(BackendUnavailable):
        await writer.flush()
    assert (writer.written, writer.pending) == (checkpoint_at(2), checkpoint_at(3))
    assert await store.load("s") == checkpoint_at(2)
    await writer.flush()
    assert await store.load("s") == checkpoint_at(3)
    await writer.aclose()


async def test_a_store_error_that_is_not_a_wal_error_is_wrapped() -> None:
    store = GatedStore()
    writer = CheckpointWriter(store, "s", interval=0)
    store.fail_next = OSError(5, "Input/output error")
    writer.note(checkpoint_at(1))
    await _until(lambda: writer.pending is not None)
    with pytest.raises(BackendUnavailable, match="subscription 's'") as caught:
        await writer.flush()
    assert caught.value.__cause__ is not None
    assert isinstance(caught.value.__cause__, OSError)
    assert await store.load("s") == checkpoint_at(1)  # flush wrote it before raising
    await writer.aclose()


def test_writer_arguments_are_checked() -> None:
    store = _memory_store()
    for interval in (-1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(InvalidArgument, match="interval"):
            CheckpointWriter(store, "s", interval=interval)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CheckpointWriter(store, "s", start=5)  # type: ignore[arg-type]
    writer = CheckpointWriter(store, "s", interval=0)
    with pytest.raises(TypeError):
        writer.note("5@")  # type: ignore[arg-type]
