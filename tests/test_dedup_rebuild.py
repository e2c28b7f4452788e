"""The dedup window's rebuild on open (``interceptors._newest_keys``): the newest
``max_keys`` keys younger than ``max_age``, read back from the newest tick in stretches,
so that a busy log is read about as far back as those keys go, not as far as ``max_age``
allows. Logs are written on a fake clock, so that the stretches fall where the test says.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest
from _chain_support import FakeClock, data, log_of, member, open_manual

import interceptors
import walsvc
from interceptors import Dedup, _key_search, _newest_keys
from interceptors._dedup_slots import result_of, settled_key
from walsvc import ImmutableMessage


def _chain(max_keys: int) -> list[walsvc.abc.ChainMember]:
    return interceptors.default_chain(sync_interval=None, dedup=Dedup(max_keys=max_keys))


class _Reads:
    """How many reads the rebuild made, and how many messages they delivered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = self.messages = 0
        read = _key_search.read_batches_through

        async def counted(*args: Any) -> AsyncGenerator[Sequence[ImmutableMessage], None]:
            self.calls += 1
            async for batch in read(*args):
                self.messages += len(batch)
                yield batch

        monkeypatch.setattr(_key_search, "read_batches_through", counted)


async def _write(url: str, clock: FakeClock, steps: list[tuple[int, int, int]]) -> None:
    """Per step (milliseconds to move the clock, keyed messages, plain ones): one
    ``append_many`` at that time, its keyed messages numbered on from the last step's."""
    wal = await open_manual(url, clock, interceptors=_chain(1_000_000))
    number = 0
    async with wal:
        for gap, keyed, plain in steps:
            clock.ms += gap
            batch = [data(b"k", idempotency_key=f"k{number + i}") for i in range(keyed)]
            batch += [data(b"p") for _ in range(plain)]
            number += keyed
            await wal.append_many(batch)


def _expected_window(log: list[ImmutableMessage], max_keys: int) -> dict[Any, walsvc.AppendResult]:
    """The keys a window of ``max_keys`` holds after reading ``log`` whole (no key is in
    it twice here): the newest ``max_keys`` settled keys, with their results."""
    settled = [(key, result_of(m)) for m in log if (key := settled_key(m)) is not None]
    return dict(settled[-max_keys:])


def _check_window(dedup: Dedup, log: list[ImmutableMessage], max_keys: int) -> None:
    expected = _expected_window(log, max_keys)
    window = dedup._keys
    assert len(window) == len(expected)
    for key, result in expected.items():
        assert window.get(key) == result
    # Every key settled at or above forgotten_below is in the window (a Recall trusts it).
    for message in log:
        key = settled_key(message)
        if key is not None and message.timetick >= window.forgotten_below:
            assert key in expected


async def test_a_busy_log_is_read_back_only_as_far_as_the_window_goes(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 keys over 400 ms, a window of 100, stretches by ticks (as where ids do not
    count messages: Pulsar): the first two stretches (30 ms) hold them."""
    monkeypatch.setattr(_newest_keys, "_next_position", lambda latest: None)
    clock = FakeClock()
    await _write(url, clock, [(1, 10, 5)] * 100 + [(3, 10, 5)] * 100)
    reads = _Reads(monkeypatch)
    async with await open_manual(url, clock, interceptors=_chain(100)) as wal:
        dedup = member(wal, Dedup)
        log = await log_of(wal)
        _check_window(dedup, log, 100)
        assert dedup.rebuilt == 100
    # The newest 10 ms, then the 20 before: 11 appends of 15 messages (110 keys), and
    # what the start of each read takes before its first tick.
    assert reads.messages <= 300, reads.messages
    assert len(log) > 3000


async def test_a_quiet_stretch_before_the_newest_keys_is_crossed_in_longer_strides(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 s of keys, then 1 s of a few plain messages, stretches by ticks (as where ids
    do not count messages): they reach back 10, 30, 70 ... 1270 ms (a few keys), then
    2550 ms (enough); the older keys are not read."""
    monkeypatch.setattr(_newest_keys, "_next_position", lambda latest: None)
    clock = FakeClock()
    await _write(url, clock, [(100, 20, 0)] * 100 + [(500, 0, 1)] * 2)
    reads = _Reads(monkeypatch)
    async with await open_manual(url, clock, interceptors=_chain(150)) as wal:
        dedup = member(wal, Dedup)
        log = await log_of(wal)
        _check_window(dedup, log, 150)
    assert reads.messages < 600, reads.messages  # of 2,000 keys


@pytest.mark.parametrize("by_ticks", [False, True])
async def test_a_log_with_fewer_keys_than_the_window_is_read_whole(
    url: str, by_ticks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log that holds fewer messages than keys are wanted is read in one go, from the
    floor, where ids count messages; where they do not, the stretches end at the first
    that starts where the log (or max_age) does: a 700 ms log is read in 7 at most (1 on
    file://, whose search for a tick finds a log this small's first record), not in one
    per doubling up to max_age."""
    clock = FakeClock()
    await _write(url, clock, [(7, 3, 2)] * 100)
    reads = _Reads(monkeypatch)
    if by_ticks:
        monkeypatch.setattr(_newest_keys, "_next_position", lambda latest: None)
    async with await open_manual(url, clock, interceptors=_chain(1000)) as wal:
        dedup = member(wal, Dedup)
        _check_window(dedup, await log_of(wal), 1000)
        assert dedup.rebuilt == 300
        assert dedup._keys.forgotten_below <= (await log_of(wal))[0].timetick
    assert reads.calls <= (7 if by_ticks else 1), reads.calls


async def test_a_burst_behind_a_quiet_second_is_read_from_its_end(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30,000 keys in 30 ms, then a second of a few plain messages: the stretch that
    reaches the burst would hold all of it; it starts later, where the log to its end
    holds about as many messages as keys are wanted (ids count messages here)."""
    clock = FakeClock()
    await _write(url, clock, [(1, 1000, 0)] * 30 + [(250, 0, 1)] * 4)
    reads = _Reads(monkeypatch)
    async with await open_manual(url, clock, interceptors=_chain(500)) as wal:
        _check_window(member(wal, Dedup), await log_of(wal), 500)
    # 500 keys wanted: a stretch holds at most 500 * 1.25 + _SLACK (8,192) messages.
    assert reads.messages < 10_000, reads.messages


@pytest.mark.parametrize("slack", [_newest_keys._SLACK, 0, None])
@pytest.mark.parametrize("seed", range(6))
async def test_random_logs_rebuild_the_window_a_whole_read_would(
    url: str, seed: int, slack: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random gaps (0 ms to 3 s), batch sizes and windows: the window holds the newest
    keys, with their results, and nothing at or above its horizon is missing. Without
    slack, stretches are cut short often (and on file://, whose search for a tick lands
    up to 256 KiB early, some cannot be: they are read whole). None: stretches by
    ticks, as where ids do not count messages."""
    if slack is None:
        monkeypatch.setattr(_newest_keys, "_next_position", lambda latest: None)
    else:
        monkeypatch.setattr(_newest_keys, "_SLACK", slack)
    rng = random.Random(seed)
    clock = FakeClock()
    steps = [
        (rng.choice([0, 1, 1, 2, 5, 40, 300, 3000]), rng.randrange(0, 30), rng.randrange(0, 30))
        for _ in range(rng.randrange(20, 120))
    ]
    await _write(url, clock, steps)
    max_keys = rng.choice([1, 7, 50, 400, 5000])
    async with await open_manual(url, clock, interceptors=_chain(max_keys)) as wal:
        _check_window(member(wal, Dedup), await log_of(wal), max_keys)


@pytest.mark.parametrize("waiting", [True, False], ids=["a-keyed-append-waits", "none-waits"])
async def test_closing_does_not_wait_for_a_rebuild_stuck_in_a_read(
    monkeypatch: pytest.MonkeyPatch, waiting: bool
) -> None:
    """A WAL closes at once while its window's rebuild is stuck in a read (a broker that
    stopped answering): the keyed append waiting for the rebuild fails with
    ``WALClosed`` (it never reached the log) instead of holding ``aclose`` for good. The
    read is cancelled once, and its clean-up (a client stopping) runs to its end before
    the backend closes."""
    url = f"memory://{uuid.uuid4().hex}"
    async with await walsvc.open_wal(url, "p0") as wal:
        await wal.append(data(b"before", idempotency_key="k0"))
    reading = asyncio.Event()
    cleaned_up = asyncio.Event()

    async def stuck(*args: Any) -> AsyncGenerator[Sequence[ImmutableMessage], None]:
        reading.set()
        try:
            await asyncio.Event().wait()  # never set
        finally:
            await asyncio.sleep(0.05)  # as a broker client takes to stop
            cleaned_up.set()
        yield []

    monkeypatch.setattr(_key_search, "read_batches_through", stuck)
    wal = await walsvc.open_wal(url, "p0")
    keyed = asyncio.ensure_future(wal.append(data(b"after", idempotency_key="k1")))
    if not waiting:
        keyed.cancel()
    async with asyncio.timeout(10):
        await reading.wait()
    await asyncio.sleep(0.01)
    assert keyed.cancelled() != waiting
    async with asyncio.timeout(10):  # before: forever
        await wal.aclose()
        if waiting:
            with pytest.raises(walsvc.WALClosed):
                await keyed
    assert cleaned_up.is_set()  # before: cancelled again in its clean-up, left running
    monkeypatch.undo()
    async with await walsvc.open_wal(url, "p0", read_only=True) as reader:
        kept = [m.payload for m in await log_of(reader) if m.type is walsvc.MessageType.INSERT]
    assert kept == [b"before"]
