"""The base log of the damaged-log tests (``test_file_damaged_records.py``,
``test_file_torn_tail.py``) and the checks they share. Damage yields ``CorruptRecord`` or
a clean torn-tail cut, never a wrong message, a lost acknowledged record, a reused id, a
hang, or another exception.

Every case starts from the same small log (several segments, several frames in each, built
once per test module) copied into a fresh directory, damages one thing, then checks:

- read-only, before anything repairs the log, and
- read-write (which recovers the tail), then appending.

Every message read back is compared with what was written: id, timetick, vchannel, type,
payload, properties and writer term.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass
from pathlib import Path

from _file_support import open_bare
from _segments import durable_bytes, whole_frames
from hypothesis import HealthCheck, settings

import walsvc
from walsvc import CorruptRecord, DeliverPolicy, ImmutableMessage, Message, MessageType
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import encode_frames, segment_seq
from walsvc.core._encode import encode

__all__ = (
    "PCHANNEL",
    "PROPERTY",
    "SEGMENT_SIZE",
    "BaseLog",
    "Expected",
    "Frame",
    "Outcome",
    "assert_prefix",
    "fields",
    "outcome",
    "pristine_log",
    "read_all",
    "segment_path",
    "torn_frame",
)

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
    """Where one frame of the base log lies, and the records it holds."""

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
    # runway (its effect has tests of its own, in test_file_torn_tail.py).
    files = {name: (pdir / name).read_bytes() for name in os.listdir(pdir)}
    frames = []
    for name in sorted(n for n in files if segment_seq(n) is not None):
        files[name] = durable_bytes(files[name])
        frames += [
            Frame(name, h.offset, h.end, h.first_seq, h.count) for h in whole_frames(files[name])
        ]
    return BaseLog(files, expected, frames, term)


def pristine_log(directory: Path) -> BaseLog:
    """The base log, built under ``directory``: a test module's ``base_log`` fixture."""
    log = asyncio.run(_build(directory))
    # The cases need: several segments, and several frames in the newest one.
    assert len(log.segments) >= 3
    assert len(log.frames_of(log.newest)) >= 3
    assert sum(f.count for f in log.frames) == len(log.expected)
    return log


def fields(message: ImmutableMessage) -> Expected:
    """What a message read back is compared on with what was written."""
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


async def read_all(wal: walsvc.WAL) -> list[ImmutableMessage]:
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


async def outcome(root: Path, *, read_only: bool) -> Outcome:
    """Open, read everything, close; CorruptRecord is an outcome, any other error is not."""
    try:
        async with await open_bare(
            f"file://{root}", PCHANNEL, read_only=read_only, segment_size=SEGMENT_SIZE
        ) as wal:
            return await read_all(wal)
    except CorruptRecord as exc:
        return exc


def assert_prefix(messages: list[ImmutableMessage], base: BaseLog, length: int) -> None:
    """``messages`` are exactly the first ``length`` records of the base log."""
    assert [fields(m) for m in messages] == base.expected[:length]


def segment_path(root: Path, name: str) -> Path:
    """Segment file ``name`` of the log materialized under ``root``."""
    return root / PCHANNEL / name


def torn_frame(base: BaseLog) -> bytes:
    """A whole frame holding the next records, as an interrupted append would have
    written it."""
    records = [
        encode(Message(payload=bytes([7]) * n, vchannel="torn"), timetick=1, term=base.term)
        for n in (100, 3000, 10)
    ]
    return encode_frames(len(base.expected), records)
