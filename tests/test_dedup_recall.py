"""``Dedup.recall`` (``LocalWAL.recall_keys``): what became of keyed appends whose answers
were lost, told from the window, or from the log where the window dropped their keys."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from _chain_support import HoldBatches, data, log_of, member

import interceptors
import walsvc
from interceptors import Dedup
from walsvc import AppendOutcomeUnknown, InvalidArgument


def _small_window(keys: int = 8) -> list[walsvc.abc.ChainMember]:
    return interceptors.default_chain(sync_interval=None, dedup=Dedup(max_keys=keys))


class _ReadCount:
    """How many messages the reads of a Dedup's context delivered (``counting``)."""

    def __init__(self) -> None:
        self.messages = 0


class _Counted:
    """A scanner of the context's that adds what it delivers to ``count`` (a wrapper, not
    a generator: ``aclose`` must reach the scanner while a fetch of it is pending)."""

    def __init__(self, scanner: Any, count: _ReadCount) -> None:
        self._scanner = scanner
        self._count = count

    def __aiter__(self) -> _Counted:
        return self

    async def __anext__(self) -> walsvc.ImmutableMessage:
        message: walsvc.ImmutableMessage = await anext(self._scanner)
        self._count.messages += 1
        return message

    async def aclose(self) -> None:
        await self._scanner.aclose()


def counting(monkeypatch: pytest.MonkeyPatch, dedup: Dedup) -> _ReadCount:
    """Count the messages every read of ``dedup``'s context delivers from here on."""
    count = _ReadCount()
    context = dedup._context
    read = context.read
    monkeypatch.setattr(context, "read", lambda *args, **kw: _Counted(read(*args, **kw), count))
    return count


async def test_keys_the_window_dropped_are_found_in_the_log_and_land_once(url: str) -> None:
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window()) as wal:
        seen = (await wal.append(data(b"before"))).timetick  # an answer the producer had
        lost = [await wal.append(data(b"lost", idempotency_key=f"k{i}")) for i in range(5)]
        for i in range(40):  # other producers: the window drops k0..k4
            await wal.append(data(b"other", idempotency_key=f"o{i}"))
        dedup = member(wal, Dedup)
        assert dedup._keys.forgotten_below > seen
        asked = [("v1", f"k{i}") for i in range(5)] + [("v1", "never"), ("v2", "k0")]
        recalled = await wal.recall_keys(asked, seen)
        assert recalled == [*lost, None, None]
        # found keys are back in the window: a resend is answered, not appended again
        again = await wal.append_many([data(b"lost", idempotency_key=f"k{i}") for i in range(5)])
        assert again == lost
        log = await log_of(wal)
    assert sum(1 for m in log if m.idempotency_key and m.idempotency_key[0] == "k") == 5


async def test_without_a_dropped_key_the_window_answers_alone(url: str) -> None:
    """While the window has dropped nothing since ``since_tick``, a key it does not hold
    did not land: no read of the log (shown by a key in the log, below the window's
    horizon, that a caller claiming a later ``since_tick`` is told is not there)."""
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window(4)) as wal:
        old = await wal.append(data(b"x", idempotency_key="old"))
        for i in range(8):
            await wal.append(data(b"x", idempotency_key=f"o{i}"))
        kept = await wal.append(data(b"x", idempotency_key="kept"))
        horizon = member(wal, Dedup)._keys.forgotten_below
        assert old.timetick < horizon <= kept.timetick
        assert await wal.recall_keys([("v1", "old"), ("v1", "kept")], horizon) == [None, kept]
        assert await wal.recall_keys([("v1", "old")], old.timetick) == [old]


async def test_a_recall_reads_only_the_stretch_the_window_forgot(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key the window does not hold settled, if at all, below ``forgotten_below``: the
    read for it ends there, not at the end of the log (here 300 messages without keys
    later, which the window never holds)."""
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window()) as wal:
        seen = (await wal.append(data(b"before"))).timetick
        for i in range(20):  # the window drops o0..o11
            await wal.append(data(b"other", idempotency_key=f"o{i}"))
        await wal.append_many([data(b"plain") for _ in range(300)])
        dedup = member(wal, Dedup)
        forgotten_below = dedup._keys.forgotten_below
        forgotten = sum(1 for m in await log_of(wal) if seen <= m.timetick < forgotten_below)
        assert 12 <= forgotten < 30
        read = counting(monkeypatch, dedup)
        assert await wal.recall_keys([("v1", "never"), ("v2", "o3")], seen) == [None, None]
        assert forgotten <= read.messages <= forgotten + 1  # the one at forgotten_below


async def test_a_recall_stops_reading_once_every_key_is_found(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window()) as wal:
        seen = (await wal.append(data(b"before"))).timetick
        lost = [await wal.append(data(b"lost", idempotency_key=f"k{i}")) for i in range(5)]
        for i in range(40):  # the window drops k0..k4
            await wal.append(data(b"other", idempotency_key=f"o{i}"))
        read = counting(monkeypatch, member(wal, Dedup))
        assert await wal.recall_keys([("v1", f"k{i}") for i in range(5)], seen) == lost
        assert read.messages == 6  # "before", k0..k4


async def test_a_key_in_flight_is_waited_for(url: str) -> None:
    hold = HoldBatches()
    async with await walsvc.open_wal(url, "p0", interceptors=[*_small_window(), hold]) as wal:
        appending = asyncio.ensure_future(wal.append(data(b"x", idempotency_key="k")))
        await hold.holding.wait()  # claimed: in flight
        recalling = asyncio.ensure_future(wal.recall_keys([("v1", "k")], 0))
        await asyncio.sleep(0.01)
        assert not recalling.done()
        hold.release.set()
        assert await recalling == [await appending]


async def test_the_window_is_rebuilt_with_its_horizon(tmp_path: Path) -> None:
    """Reopened, the window holds the log's keys younger than its age; the recall of
    an older key reads the log."""
    url = f"file://{tmp_path / 'log'}"
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window(4)) as wal:
        first = [await wal.append(data(b"x", idempotency_key=f"k{i}")) for i in range(10)]
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window(4)) as wal:
        await wal.wait_ready()
        await member(wal, Dedup).wait_rebuilt()
        assert len(member(wal, Dedup)) == 4
        assert await wal.recall_keys([("v1", "k0"), ("v1", "k9")], 0) == [first[0], first[9]]


async def test_truncated_keys_are_forgotten_as_on_open() -> None:
    """Truncated messages are not found (the rebuild on open forgets them too)."""
    name = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(name, "p0", interceptors=_small_window(2)) as wal:
        seen = (await wal.append(data(b"before"))).timetick
        results = [await wal.append(data(b"x", idempotency_key=f"k{i}")) for i in range(6)]
        assert len(member(wal, Dedup)) == 2  # k4 and k5
        await wal.truncate(results[1].message_id)
        assert await wal.recall_keys([("v1", "k0"), ("v1", "k3")], seen) == [None, results[3]]


async def test_a_log_that_cannot_be_read_cannot_tell(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window(2)) as wal:
        seen = (await wal.append(data(b"before"))).timetick
        for i in range(6):
            await wal.append(data(b"x", idempotency_key=f"k{i}"))
        dedup = member(wal, Dedup)

        async def damaged(*_: object) -> walsvc.DeliverPolicy:
            raise walsvc.CorruptRecord("a damaged record (injected)")

        monkeypatch.setattr(dedup._context, "start_at_timetick", damaged)
        with pytest.raises(AppendOutcomeUnknown, match="cannot be told"):
            await wal.recall_keys([("v1", "k0")], seen)


async def test_a_chain_without_a_window_refuses() -> None:
    async with await walsvc.open_wal(f"memory://{uuid.uuid4().hex}", "p0", interceptors=[]) as wal:
        with pytest.raises(InvalidArgument, match="remembers no idempotency keys"):
            await wal.recall_keys([("v1", "k")], 0)


async def test_a_key_asked_twice_is_answered_twice(url: str) -> None:
    async with await walsvc.open_wal(url, "p0", interceptors=_small_window(2)) as wal:
        seen = (await wal.append(data(b"before"))).timetick
        first = await wal.append(data(b"x", idempotency_key="k"))
        for i in range(6):  # the window drops "k"
            await wal.append(data(b"x", idempotency_key=f"o{i}"))
        assert await wal.recall_keys([("v1", "k"), ("v1", "k")], seen) == [first, first]
