"""The interceptors' reads of their own log when it was truncated through its newest
message (``interceptors._reading.read_through``): the log's newest id is still known
(``latest_message_id``) but nothing through it is retained. A read of what is retained
up to that id used to wait for the next append; now it is told at once that there is
nothing.

Without ``TimetickSync`` nothing is appended on open, so the rebuild of the dedup window
waited for an append, and a keyed append waited for the rebuild: a keyed append after
reopening such a log hung for ever (and, on ``file://``, closing the WAL then hung too).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from _chain_support import FakeClock

import walsvc
from interceptors import Dedup, ExclusiveLock, Transactions, _reading
from walsvc import Message


def _url(scheme: str, tmp_path: Path) -> str:
    return f"memory://{uuid.uuid4().hex}" if scheme == "memory" else f"file://{tmp_path}"


def _chain_without_ticks() -> list[object]:
    transactions = Transactions()
    return [Dedup(), ExclusiveLock(transactions.abort_vchannel), transactions]


async def _truncate_everything(url: str) -> walsvc.AppendResult:
    async with await walsvc.open_wal(url, "p", interceptors=_chain_without_ticks()) as wal:
        await wal.append(Message(payload=b"a", vchannel="v", idempotency_key="k1"))
        newest = await wal.append(Message(payload=b"b", vchannel="v", idempotency_key="k2"))
        await wal.truncate(newest.message_id)
        return newest


@pytest.mark.parametrize("scheme", ["memory", "file"])
async def test_a_keyed_append_after_reopening_a_truncated_log_lands(
    scheme: str, tmp_path: Path
) -> None:
    url = _url(scheme, tmp_path)
    newest = await _truncate_everything(url)
    async with asyncio.timeout(10):
        async with await walsvc.open_wal(url, "p", interceptors=_chain_without_ticks()) as wal:
            assert await wal.latest_message_id() == newest.message_id
            again = await wal.append(Message(payload=b"c", vchannel="v", idempotency_key="k2"))
            assert again.message_id > newest.message_id  # its first copy was truncated
            assert await wal.recall_keys([("v", "k1"), ("v", "k2")], 0) == [None, again]


@pytest.mark.parametrize("scheme", ["memory", "file"])
async def test_a_rebuild_whose_stretch_starts_after_a_truncated_log_ends_reads_nothing(
    scheme: str, tmp_path: Path
) -> None:
    """The rebuild's first stretch (its newest 10 ms) begins after k1's tick: on a log
    truncated through its newest message, the search for that tick lands past the end
    (file://: at the first retained number, which no record holds yet). The read from
    there holds nothing through the newest message; it must not wait for the next
    append, which waits for the rebuild."""
    url = _url(scheme, tmp_path)
    clock = FakeClock()
    ticks = walsvc.HybridClock(now_ms=clock)
    async with await walsvc.open_wal(
        url, "p", interceptors=_chain_without_ticks(), timetick_allocator=ticks
    ) as wal:
        await wal.append(Message(payload=b"a", vchannel="v", idempotency_key="k1"))
        clock.ms += 50
        newest = await wal.append(Message(payload=b"b", vchannel="v", idempotency_key="k2"))
        await wal.truncate(newest.message_id)
    async with asyncio.timeout(10):
        async with await walsvc.open_wal(
            url, "p", interceptors=_chain_without_ticks(), timetick_allocator=ticks
        ) as wal:
            again = await wal.append(Message(payload=b"c", vchannel="v", idempotency_key="k2"))
    assert again.message_id > newest.message_id


async def test_recall_on_a_log_truncated_through_its_newest_message_is_told_at_once() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p", interceptors=[Dedup(max_keys=1)]) as wal:
        results = [
            await wal.append(Message(payload=b"x", vchannel="v", idempotency_key=f"k{i}"))
            for i in range(3)
        ]
        await wal.truncate(results[-1].message_id)
        async with asyncio.timeout(10):  # k0 was dropped by the window: the log is read
            assert await wal.recall_keys([("v", "k0")], 0) == [None]


@pytest.mark.parametrize("scheme", ["memory", "file"])
async def test_a_truncation_through_the_newest_message_as_a_read_begins_is_noticed(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the check before the read leaves: the newest message is retained when
    checked, and truncated before the read of what is retained takes its first message
    (injected: the truncation runs right after the check says the message is there)."""
    url = _url(scheme, tmp_path)
    async with await walsvc.open_wal(url, "p", interceptors=[Dedup(max_keys=1)]) as wal:
        results = [
            await wal.append(Message(payload=b"x", vchannel="v", idempotency_key=f"k{i}"))
            for i in range(3)
        ]
        checked = _reading._retained
        truncations = []

        async def retained_then_truncated(context: object, last: walsvc.MessageId) -> bool:
            there = await checked(context, last)  # type: ignore[arg-type]
            if not truncations:
                truncations.append(last)
                await wal.truncate(results[-1].message_id)
            return there

        monkeypatch.setattr(_reading, "_retained", retained_then_truncated)
        async with asyncio.timeout(10):  # k0 was dropped by the window: the log is read
            assert await wal.recall_keys([("v", "k0")], 0) == [None]
        assert truncations  # the read began from the log's start, where the race is


async def test_a_probe_that_fails_while_a_read_waits_leaves_the_read_to_tell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recheck is a probe beside the read: its failure (injected, with a recheck at
    once) neither fails nor ends the read, which goes on to deliver what is there."""
    url = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p", interceptors=[Dedup(max_keys=1)]) as wal:
        first = await wal.append(Message(payload=b"x", vchannel="v", idempotency_key="k0"))
        await wal.append(Message(payload=b"x", vchannel="v", idempotency_key="k1"))
        checked = _reading._retained
        probes = []

        async def failing_probe(context: object, last: walsvc.MessageId) -> bool:
            if not probes:  # the check before the read
                probes.append("check")
                return await checked(context, last)  # type: ignore[arg-type]
            probes.append("probe")
            raise walsvc.BackendUnavailable("the probe's consumer could not start")

        monkeypatch.setattr(_reading, "_retained", failing_probe)
        monkeypatch.setattr(_reading, "_RECHECK_SECONDS", 0)
        async with asyncio.timeout(10):  # k0 was dropped by the window: the log is read
            assert await wal.recall_keys([("v", "k0")], 0) == [first]
        # The read's first message takes the memory scanner more than one loop turn, so a
        # probe ran (deterministic: no timing in it, the recheck is at once).
        assert probes[:2] == ["check", "probe"]
