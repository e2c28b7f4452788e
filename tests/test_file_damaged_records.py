"""Damage to acknowledged records of a ``file://`` log: a segment truncated or gone, a
flipped byte, a damaged field of a frame header (the last frame's too, the case a torn write
looks like), a frame length damaged to ~4 GiB. Every read that crosses the damage reports
``CorruptRecord``; nothing is cut, skipped silently, read wrong or allocated beyond what the
file holds, and the writer's next append gets a new id.

The rule under test (``walsvc/backends/_file/_recovery.py``): records below the head
file's durable end were acknowledged and are never cut; damage to them raises
``CorruptRecord`` in every read that crosses it, and the writer appends after them under
new ids. The base log and the checks every case makes: ``_corruption_support.py``; what
follows the durable end: ``test_file_torn_tail.py``; the head file:
``test_file_head.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import pytest
from _corruption_support import (
    PCHANNEL,
    PROPERTY,
    SEGMENT_SIZE,
    BaseLog,
    Frame,
    assert_prefix,
    fields,
    pristine_log,
    segment_path,
    torn_frame,
)
from _corruption_support import outcome as _outcome
from _file_support import open_bare
from hypothesis import given
from hypothesis import strategies as st

from walsvc import CorruptRecord, DeliverPolicy, Message
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import FRAME_HEADER_SIZE, segment_seq


@pytest.fixture(scope="module")
def base_log(tmp_path_factory: pytest.TempPathFactory) -> BaseLog:
    return pristine_log(tmp_path_factory.mktemp("base"))


def _records_before(base: BaseLog, segment: str, offset: int) -> int:
    """How many records lie in whole frames that end at or before ``offset`` of
    ``segment`` (and in every older segment)."""
    count = 0
    for frame in base.frames:
        if frame.segment < segment or (frame.segment == segment and frame.end <= offset):
            count += frame.count
    return count


# ---------------------------------------------------------------------------------------
# Truncation


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
    path = segment_path(root, base_log.newest)
    os.truncate(path, cut)
    kept = _records_before(base_log, base_log.newest, cut)

    read_only = await _outcome(root, read_only=True)
    if not isinstance(read_only, CorruptRecord):
        assert_prefix(read_only, base_log, kept)
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
    os.truncate(segment_path(root, segment), cut)
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
    path = segment_path(tmp_path, segment)
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
# Byte flips


def _frame_at(base: BaseLog, segment: str, offset: int) -> Frame:
    return next(f for f in base.frames_of(segment) if f.offset <= offset < f.end)


async def _check_flip(base: BaseLog, root: Path, segment: str, offset: int, mask: int) -> None:
    """One flipped byte of an acknowledged frame: every read crossing it reports it, a
    read-write open cuts nothing, and the next append gets a new id."""
    base.materialize(root)
    path = segment_path(root, segment)
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
# A bad frame before valid ones in the newest segment


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
    path = segment_path(tmp_path, base_log.newest)
    data = bytearray(path.read_bytes())
    if then_a_torn_write:
        torn = torn_frame(base_log)
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
    assert [fields(m) for m in tail] == base_log.expected[first_after:]


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
    path = segment_path(tmp_path, base_log.newest)
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
