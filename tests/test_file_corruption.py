"""Damaged ``file://`` logs: truncation, byte flips and garbage tails yield
``CorruptRecord`` or a clean torn-tail cut, never a wrong message, a lost acknowledged
record, a reused id, a hang, or another exception.

Every case starts from the same small log (several segments, several frames in each, built
once per module) copied into a fresh directory, damages one thing, then checks:

- read-only, before anything repairs the log, and
- read-write (which recovers the tail), then appending.

The rule under test (``walsvc/backends/_file/_recovery.py``): records below the head
file's durable end were acknowledged and are never cut; damage to them raises
``CorruptRecord`` in every read that crosses it, and the writer appends after them under
new ids. After the durable end, a frame that fails its checks with nothing valid after it
is a torn write and is cut on a read-write open. Every message read back is compared with
what was written: id, timetick, vchannel, type, payload, properties and writer term. The
head file has tests of its own (``test_file_head.py``).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _segments import durable_bytes, whole_frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import walsvc
from walsvc import CorruptRecord, DeliverPolicy, ImmutableMessage, Message, MessageType
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import FRAME_HEADER_SIZE, encode_frames, segment_seq
from walsvc.core._encode import encode


def open_bare(*args: Any, **kwargs: Any) -> Awaitable[walsvc.WAL]:
    """A bare WAL (no interceptors): the log holds exactly what the test appends, with no
    TimeTicks, because these tests are about the backend underneath."""
    kwargs.setdefault("interceptors", [])
    return walsvc.open_wal(*args, **kwargs)


PCHANNEL = "p"
SEGMENT_SIZE = 4096  # the smallest allowed: many segments from a small log
Expected = tuple[FileMessageId, int, str, MessageType, bytes, dict[str, str], int]
Outcome = list[ImmutableMessage] | CorruptRecord

# Each example copies a ~30 KB log into a fresh directory under tmp_path (hence the
# suppressed health check) and opens it two or three times: a few ms. No example database:
# a failure prints its reproduction blob (profile "ci"), and examples saved from an older
# shape of the base log would replay as spurious FlakyStrategyDefinition errors.
PROPERTY = settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    database=None,
)


@dataclass(frozen=True)
class Frame:
    segment: str  # file name
    offset: int
    end: int
    first_seq: int
    count: int


class BaseLog:
    """The pristine log: its files, what was written, and where each frame lies.

    (A plain class with a short repr: hypothesis pretty-prints test arguments, and with a
    dataclass full of bytes it misreports failures as FlakyStrategyDefinition.)
    """

    __slots__ = ("expected", "files", "frames", "term")

    def __init__(
        self, files: dict[str, bytes], expected: list[Expected], frames: list[Frame], term: int
    ) -> None:
        self.files = files
        self.expected = expected
        self.frames = frames  # in log order
        self.term = term

    def __repr__(self) -> str:
        return f"<base log: {len(self.expected)} records in {self.segments}>"

    @property
    def segments(self) -> list[str]:
        return sorted(name for name in self.files if segment_seq(name) is not None)

    @property
    def newest(self) -> str:
        return self.segments[-1]

    def frames_of(self, segment: str) -> list[Frame]:
        return [f for f in self.frames if f.segment == segment]

    def materialize(self, root: Path) -> Path:
        """Write the log's files under ``root``; return the pchannel directory."""
        directory = root / PCHANNEL
        directory.mkdir(parents=True)
        for name, data in self.files.items():
            (directory / name).write_bytes(data)
        return directory


def _message(rng: random.Random, i: int) -> Message:
    properties = {"i": str(i)} if i % 3 else {}
    if i % 4 == 1:
        properties["k"] = "v" * rng.randrange(50)
    return Message(
        payload=rng.randbytes(rng.choice([0, 1, 17, rng.randrange(900)])),
        vchannel=f"vc{i % 3}",
        type=(MessageType.INSERT, MessageType.DELETE, MessageType(10_001))[i % 3],
        properties=properties,
    )


async def _build(directory: Path) -> BaseLog:
    rng = random.Random(20240611)
    expected: list[Expected] = []
    async with await open_bare(f"file://{directory}", PCHANNEL, segment_size=SEGMENT_SIZE) as wal:
        i = 0
        for _ in range(30):
            batch = [_message(rng, i + k) for k in range(rng.randint(1, 5))]
            i += len(batch)
            if len(batch) == 1:
                results = [await wal.append(batch[0])]
            else:
                results = await wal.append_many(batch)
            for m, r in zip(batch, results, strict=True):
                assert isinstance(r.message_id, FileMessageId)
                expected.append(
                    (r.message_id, r.timetick, m.vchannel, m.type, m.payload,
                     dict(m.properties), wal.term)
                )  # fmt: skip
        term = wal.term
    pdir = directory / PCHANNEL
    # The damage below is placed relative to the last frame, so the base log keeps no
    # runway (its effect has tests of its own, in (d)).
    files = {name: (pdir / name).read_bytes() for name in os.listdir(pdir)}
    frames = []
    for name in sorted(n for n in files if segment_seq(n) is not None):
        files[name] = durable_bytes(files[name])
        frames += [
            Frame(name, h.offset, h.end, h.first_seq, h.count) for h in whole_frames(files[name])
        ]
    return BaseLog(files, expected, frames, term)


@pytest.fixture(scope="module")
def base_log(tmp_path_factory: pytest.TempPathFactory) -> BaseLog:
    log = asyncio.run(_build(tmp_path_factory.mktemp("base")))
    # The cases below need: several segments, and several frames in the newest one.
    assert len(log.segments) >= 3
    assert len(log.frames_of(log.newest)) >= 3
    assert sum(f.count for f in log.frames) == len(log.expected)
    return log


def _fields(message: ImmutableMessage) -> Expected:
    assert isinstance(message.message_id, FileMessageId)
    return (
        message.message_id,
        message.timetick,
        message.vchannel,
        message.type,
        message.payload,
        dict(message.properties),
        message.term,
    )


async def _read_all(wal: walsvc.WAL) -> list[ImmutableMessage]:
    """Everything up to the latest id. A scanner that neither delivers nor raises would
    wait forever: that fails the test (the logs here read in milliseconds)."""
    last = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    if last is None:
        return out
    try:
        async with asyncio.timeout(3), wal.read(DeliverPolicy.all()) as scanner:
            async for message in scanner:
                out.append(message)
                if message.message_id >= last:
                    break
    except TimeoutError:
        raise AssertionError(f"reading hung after {len(out)} of {last} messages") from None
    return out


async def _outcome(root: Path, *, read_only: bool) -> Outcome:
    """Open, read everything, close; CorruptRecord is an outcome, any other error is not."""
    try:
        async with await open_bare(
            f"file://{root}", PCHANNEL, read_only=read_only, segment_size=SEGMENT_SIZE
        ) as wal:
            return await _read_all(wal)
    except CorruptRecord as exc:
        return exc


def _assert_prefix(messages: list[ImmutableMessage], base: BaseLog, length: int) -> None:
    assert [_fields(m) for m in messages] == base.expected[:length]


async def _assert_appends_continue(root: Path, base: BaseLog, kept: int) -> None:
    """After a clean cut at ``kept`` records: the next append gets id ``kept`` and a tick
    above the last kept one, and a reopened log holds exactly the prefix plus it."""
    url = f"file://{root}"
    async with await open_bare(url, PCHANNEL, segment_size=SEGMENT_SIZE) as wal:
        result = await wal.append(Message(payload=b"after", vchannel="vc9"))
    assert result.message_id == FileMessageId(kept)
    if kept:
        assert result.timetick > base.expected[kept - 1][1]
    async with await open_bare(url, PCHANNEL, read_only=True) as wal:
        messages = await _read_all(wal)
    _assert_prefix(messages[:-1], base, kept)
    assert (messages[-1].message_id, messages[-1].payload) == (result.message_id, b"after")


def _records_before(base: BaseLog, segment: str, offset: int) -> int:
    """How many records lie in whole frames that end at or before ``offset`` of
    ``segment`` (and in every older segment)."""
    count = 0
    for frame in base.frames:
        if frame.segment < segment or (frame.segment == segment and frame.end <= offset):
            count += frame.count
    return count


def _segment_path(root: Path, name: str) -> Path:
    return root / PCHANNEL / name


# ---------------------------------------------------------------------------------------
# The pristine log


async def test_the_base_log_reads_back_exactly(base_log: BaseLog, tmp_path: Path) -> None:
    base_log.materialize(tmp_path)
    for read_only in (True, False):
        outcome = await _outcome(tmp_path, read_only=read_only)
        assert not isinstance(outcome, CorruptRecord)
        _assert_prefix(outcome, base_log, len(base_log.expected))
        assert len(outcome) == len(base_log.expected)


# ---------------------------------------------------------------------------------------
# (a) truncation


@PROPERTY
@given(data=st.data())
async def test_truncating_the_newest_segment_is_refused_never_cut(
    base_log: BaseLog, tmp_path: Path, data: st.DataObject
) -> None:
    """Cutting the newest segment at any byte removes acknowledged records (every frame
    of the base log is below the durable end): a read-write open refuses with
    ``CorruptRecord`` naming the segment, and leaves the file as it found it (before: it
    cut to the last whole frame, and the next appends reused the lost records' ids).
    Read-only it reads a prefix or reports CorruptRecord."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    size = len(base_log.files[base_log.newest])
    cut = data.draw(st.integers(0, size - 1), label="cut")
    base_log.materialize(root)
    path = _segment_path(root, base_log.newest)
    os.truncate(path, cut)
    kept = _records_before(base_log, base_log.newest, cut)

    read_only = await _outcome(root, read_only=True)
    if not isinstance(read_only, CorruptRecord):
        _assert_prefix(read_only, base_log, kept)
    with pytest.raises(CorruptRecord, match=base_log.newest):
        await open_bare(f"file://{root}", PCHANNEL, segment_size=SEGMENT_SIZE)
    assert path.stat().st_size == cut


@PROPERTY
@given(data=st.data())
async def test_truncating_an_older_segment_is_corruption(
    base_log: BaseLog, tmp_path: Path, data: st.DataObject
) -> None:
    """Records missing from the middle of the log are never skipped silently: reading
    them raises CorruptRecord (recovery only repairs the newest segment's tail)."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    segment = data.draw(st.sampled_from(base_log.segments[:-1]), label="segment")
    size = len(base_log.files[segment])
    cut = data.draw(st.integers(0, size - 1), label="cut")
    base_log.materialize(root)
    os.truncate(_segment_path(root, segment), cut)
    for read_only in (True, False):
        outcome = await _outcome(root, read_only=read_only)
        assert isinstance(outcome, CorruptRecord), f"read_only={read_only}: no error"


@pytest.mark.parametrize("where", ["empty", "frame-boundary", "missing", "first-missing"])
async def test_records_missing_from_an_older_segment_are_corruption(
    base_log: BaseLog, tmp_path: Path, where: str
) -> None:
    """The deterministic cases of the property above, and a segment file gone (from the
    middle, or the first one, which no truncation removed: the head file says the log
    starts at 0): reading reports CorruptRecord; it neither hangs nor blames a truncation."""
    segment = base_log.segments[0 if where == "first-missing" else 1]
    base_log.materialize(tmp_path)
    path = _segment_path(tmp_path, segment)
    if where == "empty":
        os.truncate(path, 0)
    elif where == "frame-boundary":
        os.truncate(path, base_log.frames_of(segment)[1].offset)
    else:
        path.unlink()
    for read_only in (True, False):
        outcome = await _outcome(tmp_path, read_only=read_only)
        assert isinstance(outcome, CorruptRecord), f"read_only={read_only}: no error"


# ---------------------------------------------------------------------------------------
# (b) byte flips


def _frame_at(base: BaseLog, segment: str, offset: int) -> Frame:
    return next(f for f in base.frames_of(segment) if f.offset <= offset < f.end)


async def _check_flip(base: BaseLog, root: Path, segment: str, offset: int, mask: int) -> None:
    """One flipped byte of an acknowledged frame: every read crossing it reports it, a
    read-write open cuts nothing, and the next append gets a new id."""
    base.materialize(root)
    path = _segment_path(root, segment)
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))
    for read_only in (True, False):
        outcome = await _outcome(root, read_only=read_only)
        assert isinstance(outcome, CorruptRecord), (
            f"read_only={read_only}: damage in {segment} at byte {offset} was not reported:"
            f" {len(outcome)} of {len(base.expected)} records read"
        )
    await _assert_no_id_reused(root, base)


async def _assert_no_id_reused(root: Path, base: BaseLog) -> None:
    """Damage to acknowledged records is never cut: the next append gets the id after
    the last acknowledged one, whatever the damage."""
    url = f"file://{root}"
    async with await open_bare(url, PCHANNEL, segment_size=SEGMENT_SIZE) as wal:
        result = await wal.append(Message(payload=b"after", vchannel="vc9"))
    assert result.message_id == FileMessageId(len(base.expected))


@st.composite
def _flips(draw: st.DrawFn, base: BaseLog) -> tuple[str, int, int]:
    """(segment, offset, xor mask): any byte of any segment, drawn so that frame headers
    and the newest segment are well represented."""
    segment = draw(st.one_of(st.just(base.newest), st.sampled_from(base.segments)))
    frame = draw(st.sampled_from(base.frames_of(segment)))
    offset = draw(
        st.one_of(
            st.integers(frame.offset, frame.offset + FRAME_HEADER_SIZE - 1),
            st.integers(frame.offset, frame.end - 1),
        )
    )
    return segment, offset, draw(st.integers(1, 255))


@PROPERTY
@given(data=st.data())
async def test_a_flipped_byte_is_corruption_or_a_torn_tail(
    base_log: BaseLog, tmp_path: Path, data: st.DataObject
) -> None:
    segment, offset, mask = data.draw(_flips(base_log), label="flip")
    await _check_flip(base_log, Path(tempfile.mkdtemp(dir=tmp_path)), segment, offset, mask)


async def test_every_frame_header_byte_flipped(base_log: BaseLog, tmp_path: Path) -> None:
    """Exhaustively, each byte of each frame header of the newest and oldest segments
    (two masks each: the low bit, and all bits)."""
    failures = []
    for segment in (base_log.segments[0], base_log.newest):
        for frame in base_log.frames_of(segment):
            for at in range(FRAME_HEADER_SIZE):
                for mask in (0x01, 0xFF):
                    root = Path(tempfile.mkdtemp(dir=tmp_path))
                    try:
                        await _check_flip(base_log, root, segment, frame.offset + at, mask)
                    except AssertionError as exc:
                        failures.append(f"header byte {at} ^ {mask:#04x}: {exc}")
    assert not failures, "\n".join(failures[:12]) + f"\n({len(failures)} cases)"


# ---------------------------------------------------------------------------------------
# (d) garbage after the last frame


@PROPERTY
@given(length=st.integers(1, 20_000))
async def test_zeros_after_the_last_frame_are_a_clean_end(
    base_log: BaseLog, tmp_path: Path, length: int
) -> None:
    """Zeros after the last frame, as the writer's runway (or a crash that extended the
    file) leaves them, end the log cleanly: every record is read, a read-write open
    keeps the zeros, and the next append overwrites them."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    base_log.materialize(root)
    path = _segment_path(root, base_log.newest)
    with path.open("ab") as f:
        f.write(bytes(length))
    everything = len(base_log.expected)
    for read_only in (True, False):
        outcome = await _outcome(root, read_only=read_only)
        assert not isinstance(outcome, CorruptRecord), outcome
        _assert_prefix(outcome, base_log, everything)
        assert len(outcome) == everything
    assert path.stat().st_size == len(base_log.files[base_log.newest]) + length
    await _assert_appends_continue(root, base_log, everything)
    newest = sorted(p for p in path.parent.iterdir() if segment_seq(p.name) is not None)[-1]
    assert whole_frames(newest.read_bytes())[-1].end_seq == everything + 1


def _torn_frame(base: BaseLog) -> bytes:
    """A whole frame holding the next records, as an interrupted append would have
    written it."""
    records = [
        encode(Message(payload=bytes([7]) * n, vchannel="torn"), timetick=1, term=base.term)
        for n in (100, 3000, 10)
    ]
    return encode_frames(len(base.expected), records)


@PROPERTY
@given(data=st.data())
async def test_a_torn_last_write_is_cut(
    base_log: BaseLog, tmp_path: Path, data: st.DataObject
) -> None:
    """An append interrupted by a crash leaves some first bytes of its frame, and the file
    may already have its full length with zeros where the data did not reach the disk
    (file systems persist whole pages, in any order; a frame header can straddle a page
    boundary). Recovery cuts it, keeping everything before it."""
    frame = _torn_frame(base_log)
    written = data.draw(st.integers(0, len(frame) - 1), label="bytes that reached the disk")
    zero_filled = data.draw(st.booleans(), label="file has the frame's full length")
    torn = frame[:written] + (bytes(len(frame) - written) if zero_filled else b"")
    await _check_torn_tail(base_log, Path(tempfile.mkdtemp(dir=tmp_path)), torn)


async def _check_torn_tail(base: BaseLog, root: Path, torn: bytes) -> None:
    base.materialize(root)
    path = _segment_path(root, base.newest)
    with path.open("ab") as f:
        f.write(torn)
    everything = len(base.expected)
    outcome = await _outcome(root, read_only=False)
    assert not isinstance(outcome, CorruptRecord), f"torn tail not cut: {outcome}"
    _assert_prefix(outcome, base, everything)
    assert len(outcome) == everything
    await _assert_appends_continue(root, base, everything)


@pytest.mark.parametrize(
    "embedded", ["an old frame", "the log's own frames", "a busier log's frames"]
)
async def test_a_torn_write_carrying_frames_in_its_payload_is_cut(
    base_log: BaseLog, tmp_path: Path, embedded: str
) -> None:
    """Payloads are opaque: one may hold walsvc frames (a segment being archived or
    replicated through the log). When the append carrying it is torn by a crash, the
    frames inside its payload are not "valid frames following" a damaged one: the torn
    write is still cut, and the log opens."""
    if embedded == "an old frame":
        inner = encode_frames(
            0, [encode(Message(payload=b"old", vchannel="b"), timetick=1, term=1)]
        )
    elif embedded == "the log's own frames":
        inner = base_log.files[base_log.newest]  # valid frames, numbered below the torn one
    else:  # numbered above it, consecutively, as another pchannel's segment would be
        records = [encode(Message(payload=b"busy", vchannel="b"), timetick=1, term=1)] * 3
        inner = b"".join(
            encode_frames(len(base_log.expected) + 1000 + 3 * k, records) for k in range(4)
        )
    record = encode(
        Message(payload=b"P" * 10 + inner + b"Q" * 5000, vchannel="torn"),
        timetick=base_log.expected[-1][1] + 1,
        term=base_log.term,
    )
    frame = encode_frames(len(base_log.expected), [record])
    cut = FRAME_HEADER_SIZE + 36 + 4 + 10 + len(inner) + 100  # past the embedded frames
    assert cut < len(frame)
    await _check_torn_tail(base_log, tmp_path, frame[:cut])


@pytest.mark.parametrize("written", [1, 3, 4, 8, 11])
async def test_a_torn_frame_header_followed_by_zeros_is_cut(
    base_log: BaseLog, tmp_path: Path, written: int
) -> None:
    """The deterministic cases of the property above where only part of the frame header
    reached the disk and the rest of the frame reads as zeros."""
    frame = _torn_frame(base_log)
    await _check_torn_tail(base_log, tmp_path, frame[:written] + bytes(len(frame) - written))


@PROPERTY
@given(garbage=st.binary(min_size=1, max_size=3000))
async def test_other_garbage_after_the_last_frame(
    base_log: BaseLog, tmp_path: Path, garbage: bytes
) -> None:
    """Arbitrary bytes after the last frame: CorruptRecord, or cut off with every record
    kept; never a wrong message."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    base_log.materialize(root)
    with _segment_path(root, base_log.newest).open("ab") as f:
        f.write(garbage)
    outcome = await _outcome(root, read_only=False)
    if not isinstance(outcome, CorruptRecord):
        _assert_prefix(outcome, base_log, len(base_log.expected))
        assert len(outcome) == len(base_log.expected)


async def test_a_valid_frame_with_the_wrong_sequence_is_corruption(
    base_log: BaseLog, tmp_path: Path
) -> None:
    """A checksummed frame whose records do not continue the log (here: a copy of the
    last frame) is not taken as new records, nor cut as torn."""
    base_log.materialize(tmp_path)
    last = base_log.frames[-1]
    copy = base_log.files[last.segment][last.offset : last.end]
    with _segment_path(tmp_path, base_log.newest).open("ab") as f:
        f.write(copy)
    with pytest.raises(CorruptRecord, match="expected"):
        await open_bare(f"file://{tmp_path}", PCHANNEL)


# ---------------------------------------------------------------------------------------
# (e) a bad frame before valid ones in the newest segment


def _damage_field(data: bytearray, at: int, field: str, remaining: int) -> None:
    """Damage one field of the frame header at ``at`` (``remaining`` = bytes from the
    frame's start to the end of the file)."""
    length = int.from_bytes(data[at + 8 : at + 12], "little")
    if field == "magic":
        data[at] ^= 0x20
    elif field == "crc":
        data[at + 5] ^= 0x01
    elif field == "count":
        data[at + 12] ^= 0x01
    elif field == "first_seq":
        data[at + 16] ^= 0x01
    elif field == "body":
        data[at + FRAME_HEADER_SIZE + 3] ^= 0x80
    else:
        new_length = {
            "length-shorter": length - 1,
            "length-longer": length + 1,
            "length-past-eof": remaining + 100,
            "length-huge": 0xFFFF_FF00,
        }[field]
        data[at + 8 : at + 12] = new_length.to_bytes(4, "little")


FIELDS = [
    "magic",
    "crc",
    "count",
    "first_seq",
    "body",
    "length-shorter",
    "length-longer",
    "length-past-eof",
    "length-huge",
]


@pytest.mark.parametrize("then_a_torn_write", [False, True], ids=["alone", "then-torn"])
@pytest.mark.parametrize("field", FIELDS)
async def test_a_bad_acknowledged_frame_is_reported_never_cut(
    base_log: BaseLog, tmp_path: Path, field: str, then_a_torn_write: bool
) -> None:
    """Damage to any field of an acknowledged frame of the newest segment (one with valid
    frames after it): readers report it, the writer's open cuts neither it nor the
    records after it, and appends continue after the durable end; also when a crash then
    tore the last append, which is cut (damage and a crash are independent)."""
    frames = base_log.frames_of(base_log.newest)
    victim = frames[len(frames) // 2]
    assert victim != frames[-1]
    base_log.materialize(tmp_path)
    path = _segment_path(tmp_path, base_log.newest)
    data = bytearray(path.read_bytes())
    if then_a_torn_write:
        torn = _torn_frame(base_log)
        data += torn[: len(torn) // 2]
    _damage_field(data, victim.offset, field, len(data) - victim.offset)
    path.write_bytes(bytes(data))
    for read_only in (True, False):
        assert isinstance(await _outcome(tmp_path, read_only=read_only), CorruptRecord)
    await _assert_no_id_reused(tmp_path, base_log)
    # Every record after the damage is kept, and a read that starts after it does not
    # cross it: it reads them all.
    first_after = victim.first_seq + victim.count
    async with await open_bare(f"file://{tmp_path}", PCHANNEL, read_only=True) as wal:
        after = DeliverPolicy.start_from(FileMessageId(first_after))
        async with asyncio.timeout(3), wal.read(after) as scanner:
            tail = [await anext(scanner) for _ in range(len(base_log.expected) - first_after)]
    assert [_fields(m) for m in tail] == base_log.expected[first_after:]


@pytest.mark.parametrize("field", FIELDS)
async def test_a_damaged_last_frame_is_never_cut(
    base_log: BaseLog, tmp_path: Path, field: str
) -> None:
    """The same damage to the last acknowledged frame, the case a torn write looks like:
    it is below the durable end, so it is reported, never cut, and its ids are never
    handed out again (before: a read-write open cut it silently and the next append
    reused its first id)."""
    last = base_log.frames[-1]
    base_log.materialize(tmp_path)
    path = _segment_path(tmp_path, base_log.newest)
    data = bytearray(path.read_bytes())
    _damage_field(data, last.offset, field, len(data) - last.offset)
    path.write_bytes(bytes(data))
    for read_only in (True, False):
        assert isinstance(await _outcome(tmp_path, read_only=read_only), CorruptRecord)
    await _assert_no_id_reused(tmp_path, base_log)


# ---------------------------------------------------------------------------------------
# A damaged length in a big segment


_READ_UNDER_A_MEMORY_LIMIT = """
import asyncio, resource, sys
import walsvc

resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB of address space

async def main(url, read_only):
    chain = {} if read_only else {"interceptors": []}
    async with await walsvc.open_wal(url, "p", read_only=read_only, **chain) as wal:
        async with wal.read() as scanner:
            async for _ in scanner:
                pass

try:
    asyncio.run(main(sys.argv[1], sys.argv[2] == "ro"))
except walsvc.CorruptRecord:
    print("CorruptRecord")
except BaseException as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("read_only", [True, False])
async def test_a_huge_damaged_length_is_not_allocated(tmp_path: Path, read_only: bool) -> None:
    """A frame length damaged to ~4 GiB in a segment larger than one read block (1 MiB)
    is corruption; the reader must not try to allocate what the file cannot hold (here:
    under a 1 GiB address-space limit, where that would be a MemoryError)."""
    url = f"file://{tmp_path}"
    async with await open_bare(url, "p", segment_size=8 * 1024 * 1024) as wal:
        for i in range(5):
            await wal.append(Message(payload=bytes([i]) * 400_000, vchannel="v"))
    [segment] = [n for n in os.listdir(tmp_path / "p") if segment_seq(n) is not None]
    path = tmp_path / "p" / segment
    data = bytearray(path.read_bytes())
    assert len(data) > 1024 * 1024
    data[8:12] = (0xFFFF_FF00).to_bytes(4, "little")  # the first frame's body length
    path.write_bytes(bytes(data))
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _READ_UNDER_A_MEMORY_LIMIT,
        url,
        "ro" if read_only else "rw",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await child.communicate()
    assert out.decode().strip() == "CorruptRecord", (out + err).decode(errors="replace")[-2000:]
