"""Redo: retriable errors retried with backoff, never a fenced writer, a bounded budget."""

from __future__ import annotations

import uuid
from pathlib import Path

import _faulty
import pytest
from _chain_support import FakeClock, data

import walsvc
from interceptors import Redo, default_chain

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


async def test_the_default_chain_retries_unless_the_backend_never_fails_retriably(
    tmp_path: Path,
) -> None:
    async with await walsvc.open_wal(f"file://{tmp_path}", "f") as wal:
        assert any(isinstance(m, Redo) for m in wal.interceptors)
    async with await walsvc.open_wal(f"{_faulty.SCHEME}://{uuid.uuid4().hex}", "f") as wal:
        assert any(isinstance(m, Redo) for m in wal.interceptors)
        await wal.wait_ready()  # the opening TimeTick goes past the chain
        _faulty.FaultyBackend.faults["f"] = ["unavailable"] * 2
        await wal.append(data(b"retried"))  # the default chain's Redo absorbs both
    async with await walsvc.open_wal(f"memory://{uuid.uuid4().hex}", "m") as wal:
        assert not any(isinstance(m, Redo) for m in wal.interceptors)
    assert not any(isinstance(m, Redo) for m in default_chain(retry=False))
    with pytest.raises(ValueError, match="retry=False"):
        default_chain(redo=Redo(), retry=False)


async def test_memory_appends_fail_only_with_errors_redo_would_not_retry() -> None:
    """The premise of ``MemoryBackend.retriable_appends = False``: what a memory append
    can raise (closed, fenced) is never retriable."""
    name = f"memory://{uuid.uuid4().hex}"
    wal = await walsvc.open_wal(name, "m")
    await wal.append(data(b"x"))
    async with await walsvc.open_wal(name, "m"):
        with pytest.raises(walsvc.WALFenced) as fenced:
            await wal.append(data(b"y"))
    await wal.aclose()
    with pytest.raises(walsvc.WALClosed) as closed:
        await wal.append(data(b"z"))
    assert not fenced.value.retriable
    assert not closed.value.retriable
