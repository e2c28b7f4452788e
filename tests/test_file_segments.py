"""The segments of a ``file://`` log (the conformance kit covers what every backend
shares; opening, sharing and closing a log: ``test_file_lifecycle.py``): rolling once a
segment reaches ``segment_size``, the runway of zeros ahead of the writer, whole-segment
truncation and scanners that fall behind it, exact seeks into old segments and into the
middle of frames, and messages larger than a read block.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _chain_support import take
from _file_support import SMALL_SEGMENT, file_url, open_bare, random_message, read_all, seq_of
from _segments import whole_frames

import walsvc
from walsvc import (
    AppendResult,
    DeliverPolicy,
    ImmutableMessage,
    Message,
    WALTruncated,
)
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import segment_seq
from walsvc.backends._file._segment_writer import RUNWAY


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
            i = start + offset - seq_of(self.results[0].message_id)
            sent, result = self.messages[i], self.results[i]
            assert message.message_id == result.message_id
            assert message.timetick == result.timetick
            assert (message.payload, message.vchannel, message.type) == (
                sent.payload,
                sent.vchannel,
                sent.type,
            ), f"message {seq_of(message.message_id)} differs"
            assert dict(message.properties) == dict(sent.properties)


async def _fill(
    wal: walsvc.WAL, log: Log, rng: random.Random, count: int, *, max_batch: int = 6
) -> None:
    """Append ``count`` messages in ``append`` and ``append_many`` calls of varied sizes."""
    while count > 0:
        n = min(count, rng.randint(1, max_batch))
        batch = [random_message(rng, len(log.messages) + k) for k in range(n)]
        if n == 1 and rng.random() < 0.5:
            results = [await wal.append(batch[0])]
        else:
            results = await wal.append_many(batch)
        log.add(batch, results)
        count -= n


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
    async with await open_bare(file_url(tmp_path), "p", segment_size=SMALL_SEGMENT) as wal:
        log = Log()
        await _fill(wal, log, seed, 200)
        # One batch much bigger than a segment still lands whole in one segment.
        big = [random_message(seed, 1000 + k, 3000) for k in range(5)]
        log.add(big, await wal.append_many(big))
        await _fill(wal, log, seed, 20)
        got = await read_all(wal)
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
    big_ids = {seq_of(r.message_id) for r in log.results[-25:-20]}
    holding_big = [p for p in segments if any(f[1] in big_ids for f in _frames(p))]
    assert len(holding_big) == 1, "one batch was split across segment files"


async def test_the_smallest_segment_size_is_accepted(tmp_path: Path) -> None:
    async with await open_bare(file_url(tmp_path), "p", segment_size=4096) as wal:
        await wal.append(Message(payload=b"x" * 5000, vchannel="v"))
        await wal.append(Message(payload=b"y", vchannel="v"))
    assert len(_segments(tmp_path)) == 2


# ---------------------------------------------------------------------------------------
# The runway


@pytest.mark.parametrize("sync", ["always", "none"])
async def test_the_runway_of_zeros_ahead_of_the_writer(tmp_path: Path, sync: str) -> None:
    """``sync="always"`` keeps up to ``RUNWAY`` zero bytes past the last frame (so a
    batch's ``fdatasync`` need not commit a new file size), never past ``segment_size``;
    ``sync="none"`` writes frames only. A reopen keeps the runway and appends into it."""
    url = file_url(tmp_path)
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
        got = await read_all(wal)
    assert [m.payload for m in got] == payloads
    (path,) = _segments(tmp_path)
    assert len(path.read_bytes()) == (
        len(data) if sync == "always" else whole_frames(path.read_bytes())[-1].end
    )


async def test_a_rolled_segment_ends_at_its_last_frame(tmp_path: Path) -> None:
    """A segment holding a runway (written under a larger ``segment_size``) is cut to its
    last frame when the writer rolls past it; readers cross into the next segment."""
    url = file_url(tmp_path)
    async with await open_bare(url, "p", segment_size=RUNWAY * 2) as wal:
        first = await wal.append(Message(payload=b"a" * 5000, vchannel="v"))
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        second = await wal.append(Message(payload=b"b", vchannel="v"))
        got = await read_all(wal)
    assert [(m.message_id, m.payload) for m in got] == [
        (first.message_id, b"a" * 5000),
        (second.message_id, b"b"),
    ]
    older, newest = _segments(tmp_path)
    assert older.stat().st_size == whole_frames(older.read_bytes())[-1].end
    assert whole_frames(newest.read_bytes())[0].first_seq == seq_of(second.message_id)


# ---------------------------------------------------------------------------------------
# Truncation


async def test_truncate_deletes_whole_segments_only_and_never_the_newest(
    tmp_path: Path, seed: random.Random
) -> None:
    url = file_url(tmp_path)
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        log = Log()
        await _fill(wal, log, seed, 300)
        layout = {p.name: _frames(p) for p in _segments(tmp_path)}
        last = seq_of(log.results[-1].message_id)

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
            assert seq_of(first.message_id) == cut + 1
            got = await read_all(wal)
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
    assert seq_of(result.message_id) == last + 1
    assert result.timetick > log.results[-1].timetick
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        again = await wal.append(Message(payload=b"again", vchannel="v"))
        got = await read_all(wal)
    assert seq_of(again.message_id) == last + 2
    assert again.timetick > result.timetick
    assert [(m.message_id, m.payload) for m in got] == [
        (result.message_id, b"next"),
        (again.message_id, b"again"),
    ]


async def test_truncation_survives_a_reopen(tmp_path: Path, seed: random.Random) -> None:
    url = file_url(tmp_path)
    log = Log()
    async with await open_bare(url, "p", segment_size=SMALL_SEGMENT) as wal:
        await _fill(wal, log, seed, 150)
        cut = 70
        await wal.truncate(FileMessageId(cut))
    for read_only in (True, False):
        async with await open_bare(url, "p", read_only=read_only) as wal:
            got = await read_all(wal)
            with pytest.raises(WALTruncated):
                async with wal.read(DeliverPolicy.start_from(FileMessageId(cut))) as s:
                    await take(s, 1, within=5)
        log.check(got, start=cut + 1)
        assert len(got) == len(log.messages) - cut - 1


async def _read_collecting(scanner: walsvc.Scanner, into: list[int], until: int) -> None:
    async with asyncio.timeout(10):
        async for message in scanner:
            into.append(seq_of(message.message_id))
            if into[-1] >= until:
                return


@pytest.mark.parametrize("deleted", ["its-segment-only", "its-next-segments"])
async def test_a_scanner_behind_a_truncation_never_skips(
    tmp_path: Path, seed: random.Random, deleted: str
) -> None:
    """A scanner reading a segment that truncation deletes keeps reading what it has open;
    it then either goes on without a gap or raises WALTruncated, never skipping ids."""
    async with await open_bare(file_url(tmp_path), "p", segment_size=SMALL_SEGMENT) as wal:
        log = Log()
        await _fill(wal, log, seed, 200)
        starts = [segment_seq(p.name) for p in _segments(tmp_path)]
        assert len(starts) >= 5
        last = seq_of(log.results[-1].message_id)
        async with wal.read() as scanner:
            ids = [seq_of((await take(scanner, 1))[0].message_id)]  # segment 0 is being read
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
        log.check(await read_all(wal), start=cut + 1)


async def test_a_scanner_starting_while_its_segment_is_deleted(
    tmp_path: Path, seed: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starting scanner lists the segment files, then opens the one holding its first
    record. A truncation (in the writer's thread, or another process) can delete that file
    in between: the scanner must report WALTruncated, not a raw FileNotFoundError. The race
    is made to happen: the truncation runs right after the scanner lists the directory."""
    async with await open_bare(file_url(tmp_path), "p", segment_size=SMALL_SEGMENT) as wal:
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
        assert seq_of(first.message_id) == starts[1] + 1


# ---------------------------------------------------------------------------------------
# Seeks


async def test_seeks_are_exact_everywhere(tmp_path: Path, seed: random.Random) -> None:
    """start_from / start_after into old segments, into the middle of multi-record
    frames and far past the sparse index's entries land exactly, whether the index was
    built by the writer, is empty (a fresh reader), or was built by scanning."""
    url = file_url(tmp_path)
    segment_size = 256 * 1024  # several sparse-index entries (one per 64 KiB) per segment
    log = Log()
    async with await open_bare(url, "p", segment_size=segment_size) as wal:
        while len(log.messages) < 1200:
            n = seed.randint(1, 12)
            batch = [
                random_message(
                    seed, len(log.messages) + k, seed.choice([0, 30, 2000, 9000, 40_000])
                )
                for k in range(n)
            ]
            log.add(batch, await wal.append_many(batch))
        assert len(_segments(tmp_path)) >= 5
        last = seq_of(log.results[-1].message_id)
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
            log.check(await read_all(fresh))
            await check(fresh)  # indexed by that full scan


# ---------------------------------------------------------------------------------------
# Big messages


async def test_messages_bigger_than_a_read_block_round_trip(
    tmp_path: Path, seed: random.Random
) -> None:
    """1-4 MiB payloads (the read block is 1 MiB) alone and between small ones, in one
    batch and across batches; read back by the writer, by a fresh reader, and by seeks."""
    url = file_url(tmp_path)
    mib = 1024 * 1024
    log = Log()
    async with await open_bare(url, "p", segment_size=8 * mib) as wal:
        for size in (mib + 1, 4 * mib):
            message = random_message(seed, len(log.messages), size)
            log.add([message], [await wal.append(message)])
        batch = [
            random_message(seed, len(log.messages) + k, size)
            for k, size in enumerate([10, 3 * mib, 20, 2 * mib + 7, 30, mib // 2, mib // 2])
        ]
        log.add(batch, await wal.append_many(batch))
        await _fill(wal, log, seed, 30)
        log.check(await read_all(wal))
    async with await open_bare(url, "p", read_only=True) as wal:
        log.check(await read_all(wal))
        for i, message in enumerate(log.messages):
            if len(message.payload) > mib // 2:
                async with wal.read(DeliverPolicy.start_from(FileMessageId(i))) as scanner:
                    log.check(await take(scanner, 2), start=i)
