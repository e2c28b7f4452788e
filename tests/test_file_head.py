"""The head file of a ``file://`` log: damaged, short, lost or of the older layout, and
the repair that rebuilds it (``walsvc check --repair``); logs opened read-only without
write access.

A lost or damaged head is never replaced silently: a head made up by an open would hand
out a writer term below the log's (readers then reject the new writer's records) and the
record numbers of truncated or acknowledged records. The repair derives it from the
segments: a term above every term in the log, the durable end at the end of the valid
frames, the first record of the oldest segment.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import crc32c
import pytest

import walsvc
from walsvc import CorruptRecord, DeliverPolicy, ImmutableMessage, Message
from walsvc.apps._cli import main as cli
from walsvc.backends._file import _backend as _file_backend
from walsvc.backends._file._head import UNKNOWN, HeadFile, HeadState

PCHANNEL = "p"


async def _write_log(root: Path, writers: int = 3, per_writer: int = 40) -> list[ImmutableMessage]:
    """A log of several segments written by ``writers`` successive writers (terms 1..n),
    with the default chain; returns what a reader delivers."""
    url = f"file://{root}"
    for w in range(writers):
        async with await walsvc.open_wal(url, PCHANNEL, segment_size=4096) as wal:
            await wal.append_many(
                [Message(payload=b"%d-%d" % (w, i) * 20, vchannel="v") for i in range(per_writer)]
            )
    return await _read_data(url)


async def _read_data(url: str, **kwargs: Any) -> list[ImmutableMessage]:
    async with await walsvc.open_wal(url, PCHANNEL, read_only=True, **kwargs) as wal:
        latest = await wal.latest_message_id()
        out = []
        async with asyncio.timeout(10), wal.read(DeliverPolicy.all(), raw=True) as scanner:
            async for message in scanner:
                if message.persisted and message.type is walsvc.MessageType.INSERT:
                    out.append(message)
                if message.message_id == latest:
                    break
        return out


def _repair(root: Path, *extra: str) -> int:
    return cli(["check", f"file://{root}", PCHANNEL, "--repair", *extra])


async def _assert_repaired(root: Path, before: list[ImmutableMessage]) -> None:
    """After a repair: everything reads back, and a new writer's appends (with a term
    above every term in the log) reach readers, under new ids."""
    url = f"file://{root}"
    assert [(m.message_id, m.payload) for m in await _read_data(url)] == [
        (m.message_id, m.payload) for m in before
    ]
    async with await walsvc.open_wal(url, PCHANNEL) as wal:
        assert wal.term > max(m.term for m in before)
        result = await wal.append(Message(payload=b"after", vchannel="v"))
    assert result.message_id > before[-1].message_id
    after = await _read_data(url)
    assert (after[-1].message_id, after[-1].payload) == (result.message_id, b"after")
    assert cli(["check", url, PCHANNEL]) == 0


async def test_a_lost_head_is_refused_then_rebuilt_by_the_repair(tmp_path: Path) -> None:
    """Before: the next writer opened with term 1 below the log's term 3, and every reader
    rejected its appends. Now the open refuses and names the repair."""
    before = await _write_log(tmp_path)
    (tmp_path / PCHANNEL / "head").unlink()
    url = f"file://{tmp_path}"
    for read_only in (False, True):
        with pytest.raises(CorruptRecord, match=r"head file is missing.*walsvc check .* --repair"):
            await walsvc.open_wal(url, PCHANNEL, read_only=read_only)
    assert not (tmp_path / PCHANNEL / "head").exists()  # the refused open made up nothing
    assert cli(["check", url, PCHANNEL]) == 1
    assert _repair(tmp_path) == 0
    await _assert_repaired(tmp_path, before)


async def test_a_lost_head_of_a_truncated_log(tmp_path: Path) -> None:
    """The log starts where its oldest segment starts: no "no segment holds record 0"."""
    before = await _write_log(tmp_path)
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, PCHANNEL) as wal:
        await wal.truncate(before[len(before) // 2].message_id)
    kept = [m for m in await _read_data(url)]
    (tmp_path / PCHANNEL / "head").unlink()
    assert _repair(tmp_path) == 0
    rebuilt = await _read_data(url)
    assert rebuilt[-len(kept) :] == kept[-len(kept) :] or rebuilt == kept
    await _assert_repaired(tmp_path, rebuilt)


async def test_an_empty_head_beside_segments_is_refused(tmp_path: Path) -> None:
    before = await _write_log(tmp_path, writers=1)
    os.truncate(tmp_path / PCHANNEL / "head", 0)
    with pytest.raises(CorruptRecord, match="head file is empty"):
        await walsvc.open_wal(f"file://{tmp_path}", PCHANNEL)
    assert _repair(tmp_path) == 0
    await _assert_repaired(tmp_path, before)


_CREATE_LOG = """
import asyncio, sys, walsvc

async def main(url):
    async with await walsvc.open_wal(url, "p") as wal:
        await wal.append(walsvc.Message(payload=b"first", vchannel="v"))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("look", ["exists", "empty"])
async def test_an_open_racing_the_logs_creation_takes_it_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, look: str
) -> None:
    """Another process creates the log (its head, then its first segment) at the worst
    moment of this open: just after this open looked at the head (missing, or empty).
    The open takes the new log over; before, it saw the segment made meanwhile and
    refused the healthy log as one that lost its head ("head file is missing" /
    "empty"; seen under load when two nodes made their routing log at once)."""
    url = f"file://{tmp_path}"
    head_path = str(tmp_path / PCHANNEL / "head")
    created: list[int] = []

    def create_the_log() -> None:
        if not created:
            created.append(1)
            child = subprocess.run(
                [sys.executable, "-c", _CREATE_LOG, url], capture_output=True, timeout=60
            )
            assert child.returncode == 0, child.stderr

    real_exists, real_empty = os.path.exists, HeadFile.empty

    def exists(path: Any) -> bool:
        found = real_exists(path)
        if path == head_path:
            create_the_log()
        return found

    def empty(self: HeadFile) -> bool:
        answer = real_empty(self)
        create_the_log()
        return answer

    if look == "exists":
        monkeypatch.setattr(_file_backend.os.path, "exists", exists)
    else:
        monkeypatch.setattr(HeadFile, "empty", empty)
    async with await walsvc.open_wal(url, PCHANNEL) as wal:
        monkeypatch.undo()
        await wal.append(Message(payload=b"second", vchannel="v"))
    # Looking at an empty head comes after the look for segments now: with none yet,
    # there is no such look, and the open makes the log itself.
    made_first = [b"first"] if look == "exists" else []
    assert created == [1] * len(made_first)
    assert [m.payload for m in await _read_data(url)] == [*made_first, b"second"]


@pytest.mark.parametrize("damage", ["flip", "short"])
async def test_a_damaged_head_is_corruption_and_the_repair_rebuilds_it(
    tmp_path: Path, damage: str
) -> None:
    """Every byte of the head is checked (flipped: each of them; short: several lengths):
    opens and reads raise CorruptRecord; the repair rebuilds it from the segments."""
    before = await _write_log(tmp_path / "base")
    pristine = (tmp_path / "base" / PCHANNEL / "head").read_bytes()
    cases = range(len(pristine)) if damage == "flip" else (1, 4, 30, 44, 56, 59)
    for case in cases:
        root = tmp_path / str(case)
        (root / PCHANNEL).mkdir(parents=True)
        for name in os.listdir(tmp_path / "base" / PCHANNEL):
            source = tmp_path / "base" / PCHANNEL / name
            if source.is_file():
                (root / PCHANNEL / name).write_bytes(source.read_bytes())
        data = bytearray(pristine)
        if damage == "flip":
            data[case] ^= 0x40
        else:
            del data[case:]
        (root / PCHANNEL / "head").write_bytes(bytes(data))
        url = f"file://{root}"
        with pytest.raises(CorruptRecord, match="head file"):
            await walsvc.open_wal(url, PCHANNEL, interceptors=[])
        async with await walsvc.open_wal(url, PCHANNEL, read_only=True) as wal:
            with pytest.raises(CorruptRecord, match="head file"):
                await wal.latest_message_id()
        assert _repair(root) == 0, case
        await _assert_repaired(root, before)


async def test_a_version_1_head_opens_and_is_rewritten(tmp_path: Path) -> None:
    """Logs written before the head held the durable end's position still open: the
    newest segment is scanned, and the next writer writes the new layout."""
    before = await _write_log(tmp_path, writers=1)
    head = tmp_path / PCHANNEL / "head"
    magic, _, _, *fields = struct.unpack_from("<4sHHQQQQ", head.read_bytes())
    body = struct.pack("<4sHHQQQQ", magic, 1, 0, *fields[:4])
    head.write_bytes(body + crc32c.crc32c(body).to_bytes(4, "little"))
    old = HeadFile(str(head), writable=False)
    assert old.read().end_segment == UNKNOWN
    old.close()
    await _assert_repaired(tmp_path, before)
    new = HeadFile(str(head), writable=False)
    assert new.read().end_segment != UNKNOWN
    new.close()


_READ_ONLY_ACCESS = """
import asyncio, sys
import walsvc

async def main(url):
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        latest = await wal.latest_message_id()
        count = 0
        async with wal.read(timeticks=True) as scanner:
            async for message in scanner:
                count += message.persisted
                if message.message_id == latest:
                    break
        print(count)
        try:
            wal.read(subscription="s")
        except walsvc.WALError as exc:
            print(type(exc).__name__)

asyncio.run(main(sys.argv[1]))
"""

_OPEN_FOR_WRITING = """
import asyncio, sys, walsvc
try:
    asyncio.run(walsvc.open_wal(sys.argv[1], "p"))
except walsvc.WALError as exc:
    print(type(exc).__name__, exc.retriable)
"""


def _without_write_access(root: Path) -> None:
    """Take write permission away from the pchannel's files and directories."""
    for dirpath, _, filenames in os.walk(root / PCHANNEL):
        os.chmod(dirpath, 0o555)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)


async def _run_without_write_access(code: str, root: Path) -> tuple[int, str, str]:
    """Run ``code`` in a child that permissions bind: as root, without the capabilities
    that let root write anyway (setpriv, util-linux)."""
    prefix = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv is not None, "these tests need setpriv (util-linux) when run as root"
        dropped = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--bounding-set={dropped}", f"--inh-caps={dropped}"]
    child = await asyncio.create_subprocess_exec(
        *prefix,
        sys.executable,
        "-c",
        code,
        f"file://{root}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await child.communicate()
    finally:
        for dirpath, _, _ in os.walk(root / PCHANNEL):
            os.chmod(dirpath, 0o755)
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def test_a_read_only_open_needs_no_write_access(tmp_path: Path) -> None:
    """Before: ``BackendUnavailable ... Permission denied: .../head`` (and Errno 30 on a
    read-only mount). Read where writing is not permitted; a subscription, which must
    store checkpoints, gets a typed error."""
    before = await _write_log(tmp_path, writers=1)
    _without_write_access(tmp_path)
    code, out, err = await _run_without_write_access(_READ_ONLY_ACCESS, tmp_path)
    assert code == 0, err[-2000:]
    count, error = out.split()
    assert int(count) == len(before) + 1  # and the opening TimeTick
    assert error == "WALReadOnly"


async def test_a_read_write_open_without_write_access_says_so(tmp_path: Path) -> None:
    await _write_log(tmp_path, writers=1)
    _without_write_access(tmp_path)
    _, out, err = await _run_without_write_access(_OPEN_FOR_WRITING, tmp_path)
    assert out.split() == ["WALReadOnly", "False"], err[-2000:]


def test_the_head_layout_round_trips(tmp_path: Path) -> None:
    head = HeadFile(str(tmp_path / "head"), writable=True)
    state = HeadState(3, 100, 7, 123456, 64, 4096)
    head.write(state, sync=False)
    assert head.read() == state
    assert os.path.getsize(tmp_path / "head") == 60
    head.close()
