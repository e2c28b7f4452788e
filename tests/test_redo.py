"""Redo: retriable errors retried with backoff, never a fenced writer, a bounded budget."""

from __future__ import annotations

import uuid

import _faulty
import pytest
from _chain_support import FakeClock, data

import walsvc
from interceptors import Redo

_faulty.register()


async def test_redo_retries_retriable_errors_and_never_fenced(clock: FakeClock) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    redo = Redo(sleep=sleep, give_up_after=5.0)
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "r", interceptors=[redo]) as wal:
        _faulty.FaultyBackend.faults["r"] = ["unavailable"] * 3
        await wal.append(data(b"x"))
        assert redo.retries == 3
        assert len(slept) == 3
        assert slept == sorted(slept) or max(slept) <= 0.5
        async with await walsvc.open_wal(name, "r", interceptors=[]):
            with pytest.raises(walsvc.WALFenced):
                await wal.append(data(b"y"))
        assert redo.retries == 3


async def test_redo_gives_up_after_its_budget() -> None:
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    redo = Redo(sleep=sleep, clock=lambda: now[0], give_up_after=1.0)
    name = f"{_faulty.SCHEME}://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "s", interceptors=[redo]) as wal:
        _faulty.FaultyBackend.faults["s"] = ["unavailable"] * 1000
        with pytest.raises(walsvc.BackendUnavailable):
            await wal.append(data(b"x"))
        _faulty.FaultyBackend.faults["s"] = []
    assert 1 < redo.retries < 1000
