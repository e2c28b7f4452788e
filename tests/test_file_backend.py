"""Behaviour specific to the ``file://`` backend (the conformance kit covers what every
backend shares): segment rolling and whole-segment truncation, scanners that fall behind a
truncation, exact seeks into old segments and into the middle of frames, tailing readers in
this process and in another one, fencing across processes, ``sync`` modes, option
validation, messages larger than a read block, and draining appends on close.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest
from _chain_support import take
from _crash_child import PARENT, PCHANNEL, check_message
from _segments import whole_frames

import walsvc
from walsvc import (
    AppendResult,
    DeliverPolicy,
    ImmutableMessage,
    InvalidArgument,
    Message,
    MessageType,
    WALClosed,
    WALFenced,
    WALTruncated,
)
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import segment_seq
from walsvc.backends._file._writer import RUNWAY


def open_bare(*args: Any, **kwargs: Any) -> Awaitable[walsvc.WAL]:
    """A bare WAL (no interceptors): the log holds exactly what the test appends, with no
    TimeTicks, because these tests are about the backend underneath."""
    kwargs.setdefault("interceptors", [])
    return walsvc.open_wal(*args, **kwargs)


CHILD = Path(__file__).with_name("_crash_child.py")
SMALL_SEGMENT = 4096


def _url(root: Path) -> str:
    return f"file://{root}"


def _seq(message_id: walsvc.MessageId | None) -> int:
    assert isinstance(message_id, FileMessageId)
    return message_id.seq


def _message(rng: random.Random, i: int, size: int | None = None) -> Message:
    if size is None:
        size = rng.choice([0, 10, rng.randrange(2000), rng.randrange(9000)])
    return Message(
        payload=i.to_bytes(4, "little") + rng.randbytes(size),
        vchannel=f"v{i % 5}",
        type=(MessageType.INSERT, MessageType.DELETE)[i % 2],
        properties={"i": str(i)},
    )


class Log:
    """What a test appended: the messages and their results, in log order."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.results: list[AppendResult] = []

    def add(self, messages: Sequence[Message], results: Sequence[AppendResult]) -> None:
        self.messages += messages
        self.results += results

    def check(self, got: Sequence[ImmutableMessage], start: int = 0) -> None:
        """``got`` is exactly the appended messages from id ``start`` on (a prefix)."""
        assert got, "nothing read"
        for offset, message in enumerate(got):
            i = start + offset - _seq(self.results[0].message_id)
            sent, result = self.messages[i], self.results[i]
            assert message.message_id == result.message_id
            assert message.timetick == result.timetick
            assert (message.payload, message.vchannel, message.type) == (
                sent.payload,
                sent.vchannel,
                sent.type,
            ), f"message {_seq(message.message_id)} differs"
            assert dict(message.properties) == dict(sent.properties)


async def _fill(
    wal: walsvc.WAL, log: Log, rng: random.Random, count: int, *, max_batch: int = 6
) -> None:
    """Append ``count`` messages in ``append`` and ``append_many`` calls of varied sizes."""
    while count > 0:
        n = min(count, rng.randint(1, max_batch))
        batch = [_message(rng, len(log.messages) + k) for k in range(n)]
        if n == 1 and rng.random() < 0.5:
            results = [await wal.append(batch[0])]
        else:
            results = await wal.append_many(batch)
        log.add(batch, results)
        count -= n


async def _read_all(
    wal: walsvc.WAL, deliver: DeliverPolicy | None = None
) -> list[ImmutableMessage]:
    last = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    if last is None:
        return out
    async with asyncio.timeout(20), wal.read(deliver or DeliverPolicy.all()) as scanner:
        async for message in scanner:
            out.append(message)
            if message.message_id >= last:
                break
    return out


def _segments(root: Path, pchannel: str = "p") -> list[Path]:
    directory = root / pchannel
    return sorted(p for p in directory.iterdir() if segment_seq(p.name) is not None)


def _frames(path: Path) -> list[tuple[int, int, int]]:
    """(offset, first seq, count) of every frame in a segment file."""
    return [(h.offset, h.first_seq, h.count) for h in whole_frames(path.read_bytes())]


# ---------------------------------------------------------------------------------------
# Segments


async def test_segments_roll_once_they_reach_segment_size(
    tmp_path: Path, seed: random.Random
) -> None:
    async with await open_bare(_url(tmp_path), "p", segment_size=SMALL_SEGMENT) as wal:
        log = Log()
        await _fill(wal, log, seed, 200)
        # One batch much bigger than a segment still lands whole in one segment.
        big = [_message(seed, 1000 + k, 3000) for k in range(5)]
        log.add(big, await wal.append_many(big))
        await _fill(wal, log, seed, 20)
        got = await _read_all(wal)
    log.check(got)

    segments = _segments(tmp_path)
    assert len(segments) > 10
    next_seq = 0
    for i, path in enumerate(segments):
        frames = _frames(path)
        assert frames, f"{path.name} is empty"
        # Named by its first record; records continue across segments without a gap.
        assert segment_seq(path.name) == frames[0][1] == next_seq
        for offset, first_seq, count in frames:
            assert first_seq == next_seq
            next_seq += count
            # A batch goes into the current segment while it is below segment_size...
            assert offset < SMALL_SEGMENT
        if i < len(segments) - 1:
            # ...and the next segment starts only once the current one has reached it.
            assert path.stat().st_size >= SMALL_SEGMENT
    assert next_seq == len(log.messages)
    big_ids = {_seq(r.message_id) for r in log.results[-25:-20]}
    holding_big = [p for p in segments if any(f[1] in big_ids for f in _frames(p))]
    assert len(holding_big) == 1, "one batch was split across segment files"


# ---------------------------------------------------------------------------------------
# Truncation


async def test_truncate_deletes_whole_segments_only_and_never_the_newest(
    tmp_path: Path, seed: random.Random
) -> None:
    url = _url(tmp_path)
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        log = Log()
        await _fill(wal, log, seed, 300)
        layout = {p.name: _frames(p) for p in _segments(tmp_path)}
        last = _seq(log.results[-1].message_id)

        for cut in [*sorted(seed.sample(range(last), 4)), last]:
            before = {p.name for p in _segments(tmp_path)}
            await wal.truncate(FileMessageId(cut))
            after = {p.name for p in _segments(tmp_path)}
            newest = max(before)
            for name in before:
                frames = layout[name]
                holds_newer = frames[-1][1] + frames[-1][2] - 1 > cut
                # Deleted exactly when every record in it is truncated; never the newest.
                assert (name in after) == (holds_newer or name == newest), (cut, name)
            if cut == last:
                assert after == {newest}
                break
            # Reads start right after the cut, even inside a segment still on disk.
            async with wal.read() as scanner:
                [first] = await take(scanner, 1)
            assert _seq(first.message_id) == cut + 1
            got = await _read_all(wal)
            log.check(got, start=cut + 1)
            assert len(got) == last - cut
            for gone in (cut, cut // 2, 0):
                with pytest.raises(WALTruncated):
                    async with wal.read(DeliverPolicy.start_from(FileMessageId(gone))) as s:
                        await take(s, 1, within=5)
            async with wal.read(DeliverPolicy.start_after(FileMessageId(cut))) as scanner:
                log.check(await take(scanner, 1), start=cut + 1)

        # Truncating through the newest message keeps counting: ids and ticks go on.
        result = await wal.append(Message(payload=b"next", vchannel="v"))
    assert _seq(result.message_id) == last + 1
    assert result.timetick > log.results[-1].timetick
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        again = await wal.append(Message(payload=b"again", vchannel="v"))
        got = await _read_all(wal)
    assert _seq(again.message_id) == last + 2
    assert again.timetick > result.timetick
    assert [(m.message_id, m.payload) for m in got] == [
        (result.message_id, b"next"),
        (again.message_id, b"again"),
    ]


async def test_truncation_survives_a_reopen(tmp_path: Path, seed: random.Random) -> None:
    url = _url(tmp_path)
    log = Log()
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        await _fill(wal, log, seed, 150)
        cut = 70
        await wal.truncate(FileMessageId(cut))
    for read_only in (True, False):
        async with await open_bare(url, "p", read_only=read_only) as wal:
            got = await _read_all(wal)
            with pytest.raises(WALTruncated):
                async with wal.read(DeliverPolicy.start_from(FileMessageId(cut))) as s:
                    await take(s, 1, within=5)
        log.check(got, start=cut + 1)
        assert len(got) == len(log.messages) - cut - 1


async def _read_collecting(scanner: walsvc.Scanner, into: list[int], until: int) -> None:
    async with asyncio.timeout(10):
        async for message in scanner:
            into.append(_seq(message.message_id))
            if into[-1] >= until:
                return


@pytest.mark.parametrize("deleted", ["its-segment-only", "its-next-segments"])
async def test_a_scanner_behind_a_truncation_never_skips(
    tmp_path: Path, seed: random.Random, deleted: str
) -> None:
    """A scanner reading a segment that truncation deletes keeps reading what it has open;
    it then either goes on without a gap or raises WALTruncated, never skipping ids."""
    async with await open_bare(_url(tmp_path), "p", segment_size=SMALL_SEGMENT) as wal:
        log = Log()
        await _fill(wal, log, seed, 200)
        starts = [segment_seq(p.name) for p in _segments(tmp_path)]
        assert len(starts) >= 5
        last = _seq(log.results[-1].message_id)
        async with wal.read() as scanner:
            ids = [_seq((await take(scanner, 1))[0].message_id)]  # segment 0 is being read
            assert ids == [0]
            # Through the first record of segment 1 (deletes segment 0 only), or of
            # segment 3 (deletes segments 0-2, including the one after segment 0).
            cut = starts[1] if deleted == "its-segment-only" else starts[3]
            assert cut is not None
            await wal.truncate(FileMessageId(cut))
            if deleted == "its-segment-only":
                # It reads on through its open segment; past it, record ``cut`` was
                # truncated: a scanner that had not buffered it yet says so (which batch
                # sizes decide, so both are right), one that had goes on to the end.
                try:
                    await _read_collecting(scanner, ids, last)
                except WALTruncated:
                    assert ids == list(range(len(ids))), "a gap before WALTruncated"
                    assert ids[-1] + 1 <= cut, "WALTruncated although nothing was skipped"
                    assert ids[-1] + 1 >= starts[1], "it stopped inside the open segment"
                else:
                    assert ids == list(range(last + 1))
            else:
                with pytest.raises(WALTruncated):
                    await _read_collecting(scanner, ids, last)
                assert ids == list(range(len(ids))), "a gap before WALTruncated"
                assert ids[-1] + 1 < cut + 1, "WALTruncated although nothing was skipped"
        log.check(await _read_all(wal), start=cut + 1)


async def test_a_scanner_starting_while_its_segment_is_deleted(
    tmp_path: Path, seed: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starting scanner lists the segment files, then opens the one holding its first
    record. A truncation (in the writer's thread, or another process) can delete that file
    in between: the scanner must report WALTruncated, not a raw FileNotFoundError. The race
    is made to happen: the truncation runs right after the scanner lists the directory."""
    async with await open_bare(_url(tmp_path), "p", segment_size=SMALL_SEGMENT) as wal:
        await _fill(wal, Log(), seed, 100)
        starts = [segment_seq(p.name) for p in _segments(tmp_path)]
        assert starts[0] == 0
        assert starts[1] is not None
        writer = wal.backend._writer  # type: ignore[attr-defined]
        real_listdir = os.listdir
        raced = []

        def listdir_racing_a_truncation(path: Any) -> list[str]:
            names = real_listdir(path)
            if not raced and Path(path) == tmp_path / "p":
                raced.append(path)
                writer._truncate(starts[1])  # what truncate() runs in its worker thread
            return names

        monkeypatch.setattr(os, "listdir", listdir_racing_a_truncation)
        with pytest.raises(WALTruncated):
            async with wal.read(DeliverPolicy.start_from(FileMessageId(0))) as scanner:
                await take(scanner, 1, within=5)
        assert raced
        monkeypatch.undo()
        async with wal.read() as scanner:
            [first] = await take(scanner, 1)
        assert _seq(first.message_id) == starts[1] + 1


# ---------------------------------------------------------------------------------------
# Seeks


async def test_seeks_are_exact_everywhere(tmp_path: Path, seed: random.Random) -> None:
    """start_from / start_after into old segments, into the middle of multi-record
    frames and far past the sparse index's entries land exactly, whether the index was
    built by the writer, is empty (a fresh reader), or was built by scanning."""
    url = _url(tmp_path)
    segment_size = 256 * 1024  # several sparse-index entries (one per 64 KiB) per segment
    log = Log()
    async with await open_bare(url, "p", segment_size=segment_size) as wal:
        while len(log.messages) < 1200:
            n = seed.randint(1, 12)
            batch = [
                _message(seed, len(log.messages) + k, seed.choice([0, 30, 2000, 9000, 40_000]))
                for k in range(n)
            ]
            log.add(batch, await wal.append_many(batch))
        assert len(_segments(tmp_path)) >= 5
        last = _seq(log.results[-1].message_id)
        frame_starts = {f[1] for p in _segments(tmp_path) for f in _frames(p)}
        mid_frame = [i for i in range(1, last) if i not in frame_starts]
        assert len(mid_frame) > 100
        targets = sorted(
            set(range(0, last + 1, 37))
            | set(seed.sample(sorted(frame_starts), 25))
            | set(seed.sample(mid_frame, 25))
            | {0, last}
        )

        async def check(reader: walsvc.WAL) -> None:
            for target in targets:
                want = min(4, last - target + 1)
                async with reader.read(DeliverPolicy.start_from(FileMessageId(target))) as s:
                    log.check(await take(s, want), start=target)
                if target < last:
                    policy = DeliverPolicy.start_after(FileMessageId(target))
                    async with reader.read(policy) as s:
                        log.check(await take(s, min(3, last - target)), start=target + 1)

        await check(wal)  # the writer's own index
        async with await open_bare(url, "p", read_only=True) as fresh:
            await check(fresh)  # nothing indexed yet
            log.check(await _read_all(fresh))
            await check(fresh)  # indexed by that full scan


# ---------------------------------------------------------------------------------------
# Tailing readers


async def test_a_reader_in_this_process_is_woken_by_appends(tmp_path: Path) -> None:
    """A read-only WAL in the writer's process sees appends at once: with a 60 s poll
    interval, only the in-process wakeup can deliver them within the timeout."""
    url = _url(tmp_path)
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
    url = _url(tmp_path)
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
    assert [_seq(m.message_id) for m in got] == [int(a[4]) for a in acks]
    assert [_seq(m.message_id) for m in got] == list(range(1, 51))
    assert [m.timetick for m in got] == [int(a[5]) for a in acks]
    assert [check_message(m) for m in got] == [(-1, PARENT, s) for s in range(50)]


async def test_a_writer_in_another_process_fences_this_one(
    tmp_path: Path, children: list[asyncio.subprocess.Process]
) -> None:
    url = _url(tmp_path)
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
        got = await _read_all(wal)
        await _finish(child)
    assert [m.payload for m in got][:1] == [b"mine"]
    assert [_seq(m.message_id) for m in got] == [0, int(acks[0][4]), int(acks[1][4])] == [0, 1, 2]
    assert [m.term for m in got] == [wal.term, int(ready[1]), int(ready[1])]
    async with await open_bare(url, PCHANNEL, read_only=True) as reader:
        assert [m.payload for m in await _read_all(reader)] == [m.payload for m in got]


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
    url = _url(tmp_path)
    async with await open_bare(url, "p", sync=sync) as wal:
        results = [await wal.append(Message(payload=bytes([i]), vchannel="v")) for i in range(20)]
        committer = wal.backend._writer._committer  # type: ignore[attr-defined]
        syncs = len(calls) + (0 if committer is None else committer.syncs)
    if sync == "always":
        assert syncs >= 20
    else:
        assert syncs == 0
    async with await open_bare(url, "p", read_only=True) as wal:
        got = await _read_all(wal)
    assert [(m.message_id, m.payload) for m in got] == [
        (r.message_id, bytes([i])) for i, r in enumerate(results)
    ]


@pytest.mark.parametrize("sync", ["always", "none"])
async def test_the_runway_of_zeros_ahead_of_the_writer(tmp_path: Path, sync: str) -> None:
    """``sync="always"`` keeps up to ``RUNWAY`` zero bytes past the last frame (so a
    batch's ``fdatasync`` need not commit a new file size), never past ``segment_size``;
    ``sync="none"`` writes frames only. A reopen keeps the runway and appends into it."""
    url = _url(tmp_path)
    segment_size = RUNWAY * 2
    payloads = [bytes([i]) * 100 for i in range(30)]
    async with await open_bare(url, "p", sync=sync, segment_size=segment_size) as wal:
        for payload in payloads[:20]:
            await wal.append(Message(payload=payload, vchannel="v"))
    (path,) = _segments(tmp_path)
    data = path.read_bytes()
    end = whole_frames(data)[-1].end
    if sync == "always":
        assert end < len(data) <= end + RUNWAY  # extended by the batch that passes its end
    else:
        assert len(data) == end
    async with await open_bare(url, "p", sync=sync, segment_size=segment_size) as wal:
        for payload in payloads[20:]:
            await wal.append(Message(payload=payload, vchannel="v"))
        got = await _read_all(wal)
    assert [m.payload for m in got] == payloads
    (path,) = _segments(tmp_path)
    assert len(path.read_bytes()) == (
        len(data) if sync == "always" else whole_frames(path.read_bytes())[-1].end
    )


async def test_a_rolled_segment_ends_at_its_last_frame(tmp_path: Path) -> None:
    """A segment holding a runway (written under a larger ``segment_size``) is cut to its
    last frame when the writer rolls past it; readers cross into the next segment."""
    url = _url(tmp_path)
    async with await open_bare(url, "p", segment_size=RUNWAY * 2) as wal:
        first = await wal.append(Message(payload=b"a" * 5000, vchannel="v"))
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        second = await wal.append(Message(payload=b"b", vchannel="v"))
        got = await _read_all(wal)
    assert [(m.message_id, m.payload) for m in got] == [
        (first.message_id, b"a" * 5000),
        (second.message_id, b"b"),
    ]
    older, newest = _segments(tmp_path)
    assert older.stat().st_size == whole_frames(older.read_bytes())[-1].end
    assert whole_frames(newest.read_bytes())[0].first_seq == _seq(second.message_id)


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
    url = _url(tmp_path)
    async with await open_bare(url, "p") as wal:  # so read-only has a log to open
        await wal.append(Message(payload=b"x", vchannel="v"))
    with pytest.raises(error, match=match):
        await open_bare(url, "p", read_only=read_only, **options)
    with pytest.raises(error, match=match):
        await open_bare(url, "fresh", read_only=read_only, **options)
    assert not (tmp_path / "fresh").exists(), "a rejected open created the pchannel"
    # The failed opens left the log as it was, unlocked.
    async with await open_bare(url, "p") as wal:
        assert _seq(await wal.latest_message_id()) == 0


async def test_the_smallest_segment_size_is_accepted(tmp_path: Path) -> None:
    async with await open_bare(_url(tmp_path), "p", segment_size=4096) as wal:
        await wal.append(Message(payload=b"x" * 5000, vchannel="v"))
        await wal.append(Message(payload=b"y", vchannel="v"))
    assert len(_segments(tmp_path)) == 2


async def test_opening_a_missing_log_read_only_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no-such"):
        await open_bare(_url(tmp_path), "no-such", read_only=True)
    with pytest.raises(InvalidArgument):
        await open_bare(_url(tmp_path / "no" / "root"), "p", read_only=True)
    assert os.listdir(tmp_path) == [], "a read-only open created files"
    with pytest.raises(InvalidArgument, match="path"):
        await open_bare("file://", "p")


# ---------------------------------------------------------------------------------------
# Big messages


async def test_messages_bigger_than_a_read_block_round_trip(
    tmp_path: Path, seed: random.Random
) -> None:
    """1-4 MiB payloads (the read block is 1 MiB) alone and between small ones, in one
    batch and across batches; read back by the writer, by a fresh reader, and by seeks."""
    url = _url(tmp_path)
    mib = 1024 * 1024
    log = Log()
    async with await open_bare(url, "p", segment_size=8 * mib) as wal:
        for size in (mib + 1, 4 * mib):
            message = _message(seed, len(log.messages), size)
            log.add([message], [await wal.append(message)])
        batch = [
            _message(seed, len(log.messages) + k, size)
            for k, size in enumerate([10, 3 * mib, 20, 2 * mib + 7, 30, mib // 2, mib // 2])
        ]
        log.add(batch, await wal.append_many(batch))
        await _fill(wal, log, seed, 30)
        log.check(await _read_all(wal))
    async with await open_bare(url, "p", read_only=True) as wal:
        log.check(await _read_all(wal))
        for i, message in enumerate(log.messages):
            if len(message.payload) > mib // 2:
                async with wal.read(DeliverPolicy.start_from(FileMessageId(i))) as scanner:
                    log.check(await take(scanner, 2), start=i)


# ---------------------------------------------------------------------------------------
# Closing


async def test_close_drains_queued_appends(tmp_path: Path, seed: random.Random) -> None:
    """Appends queued when close starts all complete; appends racing it complete or
    raise WALClosed, and those made once it has begun raise WALClosed; every append that
    returned a result is in the log, and those are exactly the log."""
    url = _url(tmp_path)
    wal = await open_bare(url, "p", segment_size=SMALL_SEGMENT)
    messages = [_message(seed, i) for i in range(300)]

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
        got = await _read_all(reader)
    by_id = {m.message_id: m for m in got}
    for message, result in done:
        stored = by_id[result.message_id]
        assert (stored.payload, stored.timetick) == (message.payload, result.timetick)
    assert sorted(_seq(r.message_id) for _, r in done) == list(range(len(got)))
    with pytest.raises(WALClosed):
        await wal.append(messages[0])


async def test_appends_on_a_closed_wal_raise(tmp_path: Path) -> None:
    wal = await open_bare(_url(tmp_path), "p")
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
    url = _url(tmp_path)
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
            assert _seq(await reader.latest_message_id()) == 1
            assert torn_reads
