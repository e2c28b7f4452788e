"""What follows the last frame of a ``file://`` log. Nothing (the pristine base log) and
zeros (the writer's runway, or a crash that extended the file) end it cleanly; a torn last
write (a prefix of a frame, zero-filled or not, also one carrying frames in its payload) is
cut on a read-write open with every record before it kept, and appends go on; other
garbage is cut or reported as ``CorruptRecord``, never read as messages; a valid frame
that does not continue the log is ``CorruptRecord``.

The rule under test (``walsvc/backends/_file/_recovery.py``): after the head file's durable
end, a frame that fails its checks with nothing valid after it is a torn write and is cut
on a read-write open. The base log and the checks every case makes:
``_corruption_support.py``; damage below the durable end: ``test_file_damaged_records.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from _corruption_support import (
    PCHANNEL,
    PROPERTY,
    SEGMENT_SIZE,
    BaseLog,
    assert_prefix,
    pristine_log,
    read_all,
    segment_path,
    torn_frame,
)
from _corruption_support import outcome as _outcome
from _file_support import open_bare
from _segments import whole_frames
from hypothesis import given
from hypothesis import strategies as st

from walsvc import CorruptRecord, Message
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import FRAME_HEADER_SIZE, encode_frames, segment_seq
from walsvc.core._encode import encode


@pytest.fixture(scope="module")
def base_log(tmp_path_factory: pytest.TempPathFactory) -> BaseLog:
    return pristine_log(tmp_path_factory.mktemp("base"))


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
        messages = await read_all(wal)
    assert_prefix(messages[:-1], base, kept)
    assert (messages[-1].message_id, messages[-1].payload) == (result.message_id, b"after")


# ---------------------------------------------------------------------------------------
# The pristine log


async def test_the_base_log_reads_back_exactly(base_log: BaseLog, tmp_path: Path) -> None:
    base_log.materialize(tmp_path)
    for read_only in (True, False):
        outcome = await _outcome(tmp_path, read_only=read_only)
        assert not isinstance(outcome, CorruptRecord)
        assert_prefix(outcome, base_log, len(base_log.expected))
        assert len(outcome) == len(base_log.expected)


# ---------------------------------------------------------------------------------------
# Garbage after the last frame


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
    path = segment_path(root, base_log.newest)
    with path.open("ab") as f:
        f.write(bytes(length))
    everything = len(base_log.expected)
    for read_only in (True, False):
        outcome = await _outcome(root, read_only=read_only)
        assert not isinstance(outcome, CorruptRecord), outcome
        assert_prefix(outcome, base_log, everything)
        assert len(outcome) == everything
    assert path.stat().st_size == len(base_log.files[base_log.newest]) + length
    await _assert_appends_continue(root, base_log, everything)
    newest = sorted(p for p in path.parent.iterdir() if segment_seq(p.name) is not None)[-1]
    assert whole_frames(newest.read_bytes())[-1].end_seq == everything + 1


@PROPERTY
@given(data=st.data())
async def test_a_torn_last_write_is_cut(
    base_log: BaseLog, tmp_path: Path, data: st.DataObject
) -> None:
    """An append interrupted by a crash leaves some first bytes of its frame, and the file
    may already have its full length with zeros where the data did not reach the disk
    (file systems persist whole pages, in any order; a frame header can straddle a page
    boundary). Recovery cuts it, keeping everything before it."""
    frame = torn_frame(base_log)
    written = data.draw(st.integers(0, len(frame) - 1), label="bytes that reached the disk")
    zero_filled = data.draw(st.booleans(), label="file has the frame's full length")
    torn = frame[:written] + (bytes(len(frame) - written) if zero_filled else b"")
    await _check_torn_tail(base_log, Path(tempfile.mkdtemp(dir=tmp_path)), torn)


async def _check_torn_tail(base: BaseLog, root: Path, torn: bytes) -> None:
    base.materialize(root)
    path = segment_path(root, base.newest)
    with path.open("ab") as f:
        f.write(torn)
    everything = len(base.expected)
    outcome = await _outcome(root, read_only=False)
    assert not isinstance(outcome, CorruptRecord), f"torn tail not cut: {outcome}"
    assert_prefix(outcome, base, everything)
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
    frame = torn_frame(base_log)
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
    with segment_path(root, base_log.newest).open("ab") as f:
        f.write(garbage)
    outcome = await _outcome(root, read_only=False)
    if not isinstance(outcome, CorruptRecord):
        assert_prefix(outcome, base_log, len(base_log.expected))
        assert len(outcome) == len(base_log.expected)


async def test_a_valid_frame_with_the_wrong_sequence_is_corruption(
    base_log: BaseLog, tmp_path: Path
) -> None:
    """A checksummed frame whose records do not continue the log (here: a copy of the
    last frame) is not taken as new records, nor cut as torn."""
    base_log.materialize(tmp_path)
    last = base_log.frames[-1]
    copy = base_log.files[last.segment][last.offset : last.end]
    with segment_path(tmp_path, base_log.newest).open("ab") as f:
        f.write(copy)
    with pytest.raises(CorruptRecord, match="expected"):
        await open_bare(f"file://{tmp_path}", PCHANNEL)
