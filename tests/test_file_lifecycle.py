"""A ``file://`` log opened, shared and closed (the conformance kit covers what every
backend shares; segments, truncation and seeks: ``test_file_segments.py``): tailing readers
in this process and in another one, fencing across processes, ``sync`` modes, option
validation and missing logs, draining appends on close, and torn reads of the head file
under a running writer.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _chain_support import take
from _crash_child import PARENT, PCHANNEL, check_message
from _file_support import SMALL_SEGMENT, file_url, open_bare, random_message, read_all, seq_of

from walsvc import (
    AppendResult,
    DeliverPolicy,
    InvalidArgument,
    Message,
    WALClosed,
    WALFenced,
)

CHILD = Path(__file__).with_name("_crash_child.py")


# ---------------------------------------------------------------------------------------
# Tailing readers


async def test_a_reader_in_this_process_is_woken_by_appends(tmp_path: Path) -> None:
    """A read-only WAL in the writer's process sees appends at once: with a 60 s poll
    interval, only the in-process wakeup can deliver them within the timeout."""
    url = file_url(tmp_path)
    async with await open_bare(url, "p") as writer:
        first = await writer.append(Message(payload=b"0", vchannel="v"))
        async with await open_bare(url, "p", read_only=True, poll_interval=60) as reader:
            async with (
                reader.read(DeliverPolicy.start_after(first.message_id)) as tail,
                writer.read(DeliverPolicy.start_after(first.message_id)) as own,
            ):
                for i in range(1, 6):
                    # Both scanners are already waiting at the end of the log.
                    pending = [
                        asyncio.ensure_future(take(tail, 1, within=5)),
                        asyncio.ensure_future(take(own, 1, within=5)),
                    ]
                    await asyncio.sleep(0.01)
                    assert not any(p.done() for p in pending)
                    result = await writer.append(Message(payload=str(i).encode(), vchannel="v"))
                    for got in await asyncio.gather(*pending):
                        assert [(m.message_id, m.payload) for m in got] == [
                            (result.message_id, str(i).encode())
                        ]


async def _child(*args: object) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        *map(str, args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _lines(process: asyncio.subprocess.Process, tag: str, n: int) -> list[list[str]]:
    """The next ``n`` stdout lines tagged ``tag`` (other lines are skipped)."""
    assert process.stdout is not None
    out: list[list[str]] = []
    async with asyncio.timeout(30):
        while len(out) < n:
            raw = await process.stdout.readline()
            if not raw:
                assert process.stderr is not None
                err = (await process.stderr.read()).decode(errors="replace")
                pytest.fail(f"child exited early:\n{err[-3000:]}")
            line = raw.decode().split()
            if line[0] == tag:
                out.append(line)
    return out


async def _finish(process: asyncio.subprocess.Process) -> None:
    """Let an ``append`` child close its WAL and exit; it must exit cleanly."""
    assert process.stdin is not None
    process.stdin.write(b"\n")
    await process.stdin.drain()
    async with asyncio.timeout(30):
        _, err = await process.communicate()
    assert process.returncode == 0, err.decode(errors="replace")[-3000:]


@pytest.fixture
async def children() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Child processes a test starts; any still running at the end are killed."""
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.communicate()


async def test_a_reader_in_another_process_polls_for_appends(
    tmp_path: Path, children: list[asyncio.subprocess.Process]
) -> None:
    url = file_url(tmp_path)
    async with await open_bare(url, PCHANNEL) as setup:
        start = await setup.append(Message(payload=b"start", vchannel="v"))
    async with (
        await open_bare(url, PCHANNEL, read_only=True, poll_interval=0.01) as reader,
        reader.read(DeliverPolicy.start_after(start.message_id)) as tail,
    ):
        reading = asyncio.ensure_future(take(tail, 50, within=20))
        await asyncio.sleep(0.05)
        assert not reading.done()  # waiting at the end of the log
        child = await _child("append", tmp_path, 50)
        children.append(child)
        acks = await _lines(child, "A", 50)
        got = await reading
        await _finish(child)
    assert [seq_of(m.message_id) for m in got] == [int(a[4]) for a in acks]
    assert [seq_of(m.message_id) for m in got] == list(range(1, 51))
    assert [m.timetick for m in got] == [int(a[5]) for a in acks]
    assert [check_message(m) for m in got] == [(-1, PARENT, s) for s in range(50)]


async def test_a_writer_in_another_process_fences_this_one(
    tmp_path: Path, children: list[asyncio.subprocess.Process]
) -> None:
    url = file_url(tmp_path)
    async with await open_bare(url, PCHANNEL) as wal:
        mine = await wal.append(Message(payload=b"mine", vchannel="v"))
        child = await _child("append", tmp_path, 2)
        children.append(child)
        [ready] = await _lines(child, "READY", 1)
        acks = await _lines(child, "A", 2)
        assert int(ready[1]) > wal.term
        for _ in range(2):  # fenced for good
            with pytest.raises(WALFenced):
                await wal.append(Message(payload=b"fenced", vchannel="v"))
        with pytest.raises(WALFenced):
            await wal.append_many([Message(payload=b"fenced", vchannel="v")])
        with pytest.raises(WALFenced):
            await wal.truncate(mine.message_id)
        # Reading still works, and shows the new writer's appends.
        got = await read_all(wal)
        await _finish(child)
    assert [m.payload for m in got][:1] == [b"mine"]
    assert [seq_of(m.message_id) for m in got] == [0, int(acks[0][4]), int(acks[1][4])] == [0, 1, 2]
    assert [m.term for m in got] == [wal.term, int(ready[1]), int(ready[1])]
    async with await open_bare(url, PCHANNEL, read_only=True) as reader:
        assert [m.payload for m in await read_all(reader)] == [m.payload for m in got]


# ---------------------------------------------------------------------------------------
# sync, options, missing logs


@pytest.mark.parametrize("sync", ["always", "none"])
async def test_sync_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str) -> None:
    """``always`` makes every batch durable (fdatasync) before acknowledging it; ``none``
    never syncs a batch (only a finished segment when rolling). Both read back. The
    batches' syncs are the worker thread's (``os.fdatasync``) and the commit thread's."""
    calls: list[int] = []
    real = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    url = file_url(tmp_path)
    async with await open_bare(url, "p", sync=sync) as wal:
        results = [await wal.append(Message(payload=bytes([i]), vchannel="v")) for i in range(20)]
        committer = wal.backend._writer._committer  # type: ignore[attr-defined]
        syncs = len(calls) + (0 if committer is None else committer.syncs)
    if sync == "always":
        assert syncs >= 20
    else:
        assert syncs == 0
    async with await open_bare(url, "p", read_only=True) as wal:
        got = await read_all(wal)
    assert [(m.message_id, m.payload) for m in got] == [
        (r.message_id, bytes([i])) for i, r in enumerate(results)
    ]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"sync": "sometimes"}, InvalidArgument, "sync"),
        ({"sync": True}, InvalidArgument, "sync"),
        ({"segment_size": -1}, InvalidArgument, "segment_size"),
        ({"segment_size": 0}, InvalidArgument, "segment_size"),
        ({"segment_size": 4095}, InvalidArgument, "segment_size"),
        ({"segment_size": 65536.0}, InvalidArgument, "segment_size"),
        ({"segment_size": "64MiB"}, InvalidArgument, "segment_size"),
        ({"poll_interval": 0}, InvalidArgument, "poll_interval"),
        ({"poll_interval": -0.5}, InvalidArgument, "poll_interval"),
        ({"poll_interval": 3600}, InvalidArgument, "poll_interval"),
        ({"poll_interval": "fast"}, InvalidArgument, "poll_interval"),
        ({"segmentsize": 4096}, TypeError, "segmentsize"),
        ({"sync": "none", "fsync": "always"}, TypeError, "fsync"),
    ],
)
@pytest.mark.parametrize("read_only", [False, True])
async def test_bad_options_are_typed_errors(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], match: str, read_only: bool
) -> None:
    url = file_url(tmp_path)
    async with await open_bare(url, "p") as wal:  # so read-only has a log to open
        await wal.append(Message(payload=b"x", vchannel="v"))
    with pytest.raises(error, match=match):
        await open_bare(url, "p", read_only=read_only, **options)
    with pytest.raises(error, match=match):
        await open_bare(url, "fresh", read_only=read_only, **options)
    assert not (tmp_path / "fresh").exists(), "a rejected open created the pchannel"
    # The failed opens left the log as it was, unlocked.
    async with await open_bare(url, "p") as wal:
        assert seq_of(await wal.latest_message_id()) == 0


async def test_opening_a_missing_log_read_only_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no-such"):
        await open_bare(file_url(tmp_path), "no-such", read_only=True)
    with pytest.raises(InvalidArgument):
        await open_bare(file_url(tmp_path / "no" / "root"), "p", read_only=True)
    assert os.listdir(tmp_path) == [], "a read-only open created files"
    with pytest.raises(InvalidArgument, match="path"):
        await open_bare("file://", "p")


# ---------------------------------------------------------------------------------------
# Closing


async def test_close_drains_queued_appends(tmp_path: Path, seed: random.Random) -> None:
    """Appends queued when close starts all complete; appends racing it complete or
    raise WALClosed, and those made once it has begun raise WALClosed; every append that
    returned a result is in the log, and those are exactly the log."""
    url = file_url(tmp_path)
    wal = await open_bare(url, "p", segment_size=SMALL_SEGMENT)
    messages = [random_message(seed, i) for i in range(300)]

    async def append(message: Message) -> AppendResult:
        return await wal.append(message)

    queued = [asyncio.ensure_future(append(m)) for m in messages[:200]]
    await asyncio.sleep(0)  # each has handed its record to the writer
    # Racing the close: some start just before it, some just after.
    racing = [asyncio.ensure_future(append(m)) for m in messages[200:250]]
    closing = asyncio.ensure_future(wal.aclose())
    late = [asyncio.ensure_future(append(m)) for m in messages[250:]]
    async with asyncio.timeout(30):  # an append that never resolves fails the test
        outcomes = await asyncio.gather(*queued, *racing, *late, return_exceptions=True)
        await closing

    assert all(isinstance(o, AppendResult) for o in outcomes[:200]), [
        o for o in outcomes[:200] if not isinstance(o, AppendResult)
    ][:3]
    for outcome in outcomes[200:250]:
        assert isinstance(outcome, AppendResult | WALClosed), repr(outcome)
    for outcome in outcomes[250:]:  # close had begun: the WAL is closed
        assert isinstance(outcome, WALClosed), repr(outcome)
    done = [(m, o) for m, o in zip(messages, outcomes, strict=True) if isinstance(o, AppendResult)]
    async with await open_bare(url, "p", read_only=True) as reader:
        got = await read_all(reader)
    by_id = {m.message_id: m for m in got}
    for message, result in done:
        stored = by_id[result.message_id]
        assert (stored.payload, stored.timetick) == (message.payload, result.timetick)
    assert sorted(seq_of(r.message_id) for _, r in done) == list(range(len(got)))
    with pytest.raises(WALClosed):
        await wal.append(messages[0])


async def test_appends_on_a_closed_wal_raise(tmp_path: Path) -> None:
    wal = await open_bare(file_url(tmp_path), "p")
    await wal.aclose()
    await wal.aclose()  # idempotent
    with pytest.raises(WALClosed):
        await wal.append(Message(payload=b"x", vchannel="v"))
    with pytest.raises(WALClosed):
        await wal.append_many([Message(payload=b"x", vchannel="v")])


# ---------------------------------------------------------------------------------------
# The head file under a running WAL (damaged under a writer: tests/test_file_commit.py)


async def test_a_torn_head_read_is_not_corruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers read the head file without the writers' lock, so a read can race a
    writer's 40-odd-byte ``pwrite`` and see part of the old state and part of the new one
    (observed on Linux about once in a million reads from another process). A reader must
    take that for a race, not for corruption. Here the race is made to happen."""
    url = file_url(tmp_path)
    async with await open_bare(url, "p") as writer:
        await writer.append(Message(payload=b"0", vchannel="v"))
        head = tmp_path / "p" / "head"
        old = head.read_bytes()
        await writer.append(Message(payload=b"1", vchannel="v"))
        new = head.read_bytes()
        assert old != new
        async with await open_bare(url, "p", read_only=True) as reader:
            head_fd = reader.backend.directory.head.fd  # type: ignore[attr-defined]
            # The write had copied its bytes up to the first one that changed.
            split = next(i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b)
            torn = new[: split + 1] + old[split + 1 :]
            assert torn not in (old, new)
            real_pread = os.pread
            torn_reads = []

            def racing_pread(fd: int, length: int, offset: int) -> bytes:
                data = real_pread(fd, length, offset)
                if fd == head_fd and not torn_reads:
                    torn_reads.append(fd)
                    return torn
                return data

            monkeypatch.setattr(os, "pread", racing_pread)
            assert seq_of(await reader.latest_message_id()) == 1
            assert torn_reads
