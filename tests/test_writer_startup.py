"""A writer's start (the interceptors' ``ready`` hooks) after a transient failure: the
backend was away while the WAL opened (issue 20's broker fault schedule found a WAL that
answered every append with a retriable ``BackendUnavailable`` for good once its opening
TimeTick had failed)."""

from __future__ import annotations

import asyncio
import uuid

import _faulty
import pytest
from _chain_support import data, member, whole_log

import interceptors
import walsvc
from interceptors import Transactions
from walsvc import MessageType

_faulty.register()


def _url() -> str:
    return f"{_faulty.SCHEME}://{uuid.uuid4().hex}"


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


def _chain() -> list[walsvc.ChainMember]:
    return interceptors.default_chain(sync_interval=None)  # no TimeTicks but the hooks'


@pytest.mark.parametrize(
    ("fault", "opening_ticks"), [("unavailable", 1), ("lost-write", 1), ("lost-ack", 2)]
)
async def test_an_append_after_a_transient_start_failure_starts_the_writer_again(
    fault: str, opening_ticks: int
) -> None:
    """The opening TimeTick fails (nothing written, or an unknown outcome): the append
    that waited for it raises ``BackendUnavailable`` and wrote nothing; the next one
    starts the hooks again and lands."""
    url, pchannel = _url(), _pchannel()
    _faulty.FaultyBackend.faults[pchannel] = [fault]
    async with await walsvc.open_wal(url, pchannel, interceptors=_chain()) as wal:
        with pytest.raises(walsvc.BackendUnavailable, match="could not start its writer yet"):
            await wal.append(data(b"first", idempotency_key="k1"))
        second = await wal.append(data(b"second", idempotency_key="k2"))
        again = await wal.append(data(b"second", idempotency_key="k2"))
        await wal.wait_ready()
    assert again == second
    log = await whole_log(url, pchannel)
    assert [m.payload for m in log if m.type is MessageType.INSERT] == [b"second"]
    assert [m.type for m in log].count(MessageType.TIME_TICK) == opening_ticks


async def test_concurrent_appends_around_a_failed_start_land_or_write_nothing() -> None:
    """Appends waiting together for a start that fails: each raises
    ``BackendUnavailable`` having written nothing, or lands after one restart."""
    url, pchannel = _url(), _pchannel()
    _faulty.FaultyBackend.faults[pchannel] = ["unavailable"]
    async with await walsvc.open_wal(url, pchannel, interceptors=_chain()) as wal:
        outcomes = await asyncio.gather(
            *(wal.append(data(b"%d" % i)) for i in range(5)), return_exceptions=True
        )
        outcomes += await asyncio.gather(*(wal.append(data(b"%d" % i)) for i in range(5, 10)))
    landed = {b"%d" % i: r for i, r in enumerate(outcomes) if isinstance(r, walsvc.AppendResult)}
    failed = [r for r in outcomes if not isinstance(r, walsvc.AppendResult)]
    assert failed, "the first start did not fail"
    assert all(isinstance(error, walsvc.BackendUnavailable) for error in failed), failed
    log = await whole_log(url, pchannel)
    inserts = {m.payload: m.message_id for m in log if m.type is MessageType.INSERT}
    assert inserts == {payload: r.message_id for payload, r in landed.items()}
    assert [m.type for m in log].count(MessageType.TIME_TICK) == 1  # one restart


async def test_a_restart_goes_on_from_the_hook_that_failed() -> None:
    """The opening TimeTick landed and the rollback of a transaction an earlier writer
    left open failed: the restart rolls it back once and writes no second TimeTick."""
    url, pchannel = _url(), _pchannel()
    async with await walsvc.open_wal(url, pchannel, interceptors=_chain()) as wal:
        left = await wal.begin_txn("v1")
        await left.append(data(b"orphan", vchannel="v1"))
        term = wal.term
    _faulty.FaultyBackend.faults[pchannel] = ["ok", "unavailable"]
    async with await walsvc.open_wal(url, pchannel, interceptors=_chain()) as wal:
        with pytest.raises(walsvc.BackendUnavailable, match="could not start its writer yet"):
            await wal.wait_ready()
        await wal.wait_ready()
        assert member(wal, Transactions).rolled_back_on_open == 1
        await wal.append(data(b"after"))
    log = await whole_log(url, pchannel)
    rollbacks = [m for m in log if m.type is MessageType.ROLLBACK_TXN]
    assert [m.txn for m in rollbacks] == [left.context]
    ticks = [m for m in log if m.type is MessageType.TIME_TICK and m.term != term]
    assert len(ticks) == 1


async def test_a_start_stopped_by_close_is_not_started_again() -> None:
    url, pchannel = _url(), _pchannel()
    _faulty.FaultyBackend.faults[pchannel] = ["unavailable"]
    wal = await walsvc.open_wal(url, pchannel, interceptors=_chain())
    with pytest.raises(walsvc.BackendUnavailable):
        await wal.wait_ready()
    await wal.aclose()
    with pytest.raises(walsvc.WALClosed):
        await wal.append(data(b"late"))
    assert [m.type for m in await whole_log(url, pchannel)] == []
