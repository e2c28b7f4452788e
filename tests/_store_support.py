"""The round trip every ``SubscriptionStore`` passes, whatever keeps its checkpoints; and
what the store's and the checkpoint writer's tests share: a checkpoint at a timetick, a
checkpoint saved in a ``file://`` WAL's store, and a save that fails once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import walsvc
from walsvc import Checkpoint, Filter, MessageId, MessageType
from walsvc.backends._file._subscriptions import FileSubscriptionStore
from walsvc.backends._subscriptions import StoredSubscription, SubscriptionScope, SubscriptionStore

__all__ = ("checkpoint_at", "fail_replace_once", "saved_file", "store_round_trip")


async def store_round_trip(store: SubscriptionStore, first: MessageId, second: MessageId) -> None:
    """Save, replace, load, list and delete on an empty ``store``; ``first`` < ``second``
    are ids of its pchannel. Leaves "b.reader" and "a" * 200 stored."""
    one, two = Checkpoint(first, 100), Checkpoint(second, 120)
    assert await store.names() == []
    assert await store.load("reader") is None
    await store.save("reader", one)
    await store.save("b.reader", Checkpoint(None, 7))
    await store.save("a" * 200, two)
    assert await store.load("reader") == one
    await store.save("reader", two)  # replaces
    assert await store.load("reader") == two
    assert await store.load("b.reader") == Checkpoint(None, 7)
    assert await store.load("a" * 200) == two
    assert await store.names() == ["a" * 200, "b.reader", "reader"]
    await store.delete("reader")
    await store.delete("reader")  # idempotent
    await store.delete("never-saved")
    assert await store.load("reader") is None
    assert await store.names() == ["a" * 200, "b.reader"]
    await store.save("reader", one)  # a deleted name can be saved again
    assert await store.load("reader") == one
    await store.delete("reader")
    # The scope a subscription reads is stored with its checkpoint, and replaced by the
    # next save (none given: none stored).
    scope = SubscriptionScope.of(Filter(vchannels=["v\u00e9", "v1"], types=[MessageType.INSERT]))
    await store.save("scoped", one, scope)
    assert await store.load_stored("scoped") == StoredSubscription(one, scope)
    assert await store.load("scoped") == one
    await store.save("scoped", two)
    assert await store.load_stored("scoped") == StoredSubscription(two, None)
    await store.delete("scoped")
    with pytest.raises(TypeError):
        await store.save("scoped", one, "vchannels v1")  # type: ignore[arg-type]
    with pytest.raises(walsvc.InvalidArgument):
        await store.load(".hidden")
    with pytest.raises(TypeError):
        await store.save("reader", "1@memory:0")  # type: ignore[arg-type]


def checkpoint_at(timetick: int) -> Checkpoint:
    """A checkpoint at ``timetick`` with no message id."""
    return Checkpoint(None, timetick)


async def saved_file(tmp_path: Path, checkpoint: Checkpoint) -> tuple[FileSubscriptionStore, Path]:
    """A file store (real WAL directory) holding ``checkpoint`` under "s", and its file."""
    async with await walsvc.open_wal(f"file://{tmp_path}", "p") as wal:
        store = wal.backend.subscriptions()
        assert isinstance(store, FileSubscriptionStore)
        await store.save("s", checkpoint)
    return store, tmp_path / "p" / "subscriptions" / "s"


def fail_replace_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the next ``os.replace`` raise OSError (a full disk); later ones work."""
    real = os.replace
    calls: list[int] = []

    def replace(src: str, dst: str) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls
