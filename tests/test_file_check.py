"""``walsvc check URL PCHANNEL [--repair [--force]] [--json]`` on damaged local logs: it
reports every damage with its file and offset, exits 1, and repairs only what a writer's
open may repair unless told ``--force``, which says exactly which records it drops."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from _segments import whole_frames

import walsvc
from walsvc import DeliverPolicy, Message
from walsvc.apps._cli import main as cli
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import encode_frames, segment_seq

PCHANNEL = "p"


async def _log(root: Path) -> int:
    """A log of several segments; returns how many records it holds."""
    async with await walsvc.open_wal(
        f"file://{root}", PCHANNEL, segment_size=4096, interceptors=[]
    ) as wal:
        for i in range(30):
            await wal.append_many([Message(payload=b"%d" % i * 50, vchannel="v")] * 3)
    return 90


def _segments(root: Path) -> list[Path]:
    directory = root / PCHANNEL
    return sorted(p for p in directory.iterdir() if segment_seq(p.name) is not None)


def _report(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    """``walsvc check --json`` on the log: its exit status and its report."""
    capsys.readouterr()
    code = cli(["check", f"file://{root}", PCHANNEL, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


async def test_a_sound_log_checks_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = await _log(tmp_path)
    code, report = _report(tmp_path, capsys)
    assert code == 0
    assert report["ok"] is True
    assert sum(s["records"] for s in report["segments"]) == records
    assert cli(["check", f"file://{tmp_path}", PCHANNEL]) == 0
    assert "ok" in capsys.readouterr().out.splitlines()[-1]


async def test_damage_is_reported_with_file_and_offset_and_only_forced_repair_cuts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = await _log(tmp_path)
    victim = _segments(tmp_path)[2]
    frame = whole_frames(victim.read_bytes())[1]
    data = bytearray(victim.read_bytes())
    data[frame.offset + 30] ^= 0x01
    victim.write_bytes(bytes(data))

    code, report = _report(tmp_path, capsys)
    assert code == 1
    (damage,) = report["damage"]
    assert (damage["path"], damage["offset"]) == (str(victim), frame.offset)
    assert damage["acknowledged"] is True
    assert damage["first_seq"] == frame.first_seq
    assert damage["resumes_at"] == frame.end_seq

    before = {p.name: p.read_bytes() for p in _segments(tmp_path)}
    code, report = _report(tmp_path, capsys, "--repair")
    assert code == 1
    assert "acknowledged records are damaged" in report["refused"]
    assert {p.name: p.read_bytes() for p in _segments(tmp_path)} == before  # unchanged

    code, report = _report(tmp_path, capsys, "--repair", "--force")
    assert code == 0
    assert report["dropped"] == [frame.first_seq, records - 1]
    assert any("dropped records" in action for action in report["repaired"])
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, PCHANNEL, interceptors=[]) as wal:
        result = await wal.append(Message(payload=b"after", vchannel="v"))
        assert result.message_id == FileMessageId(frame.first_seq)  # said: ids reused
        async with asyncio.timeout(5), wal.read(DeliverPolicy.all()) as scanner:
            read = [await anext(scanner) for _ in range(frame.first_seq + 1)]
    assert read[-1].payload == b"after"


async def test_a_torn_write_is_cut_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _log(tmp_path)
    newest = _segments(tmp_path)[-1]
    end = whole_frames(newest.read_bytes())[-1].end
    torn = encode_frames(10_000, [b"\x01" * 500])[:100]
    with newest.open("r+b") as f:  # where the next frame goes (over the writer's runway)
        f.truncate(end)
        f.seek(end)
        f.write(torn)
    code, report = _report(tmp_path, capsys)
    assert code == 1
    assert report["torn_tail_bytes"] == 100
    assert report["damage"] == []
    code, report = _report(tmp_path, capsys, "--repair")
    assert code == 0
    assert report["ok"] is True
    assert any("torn write" in action for action in report["repaired"])


async def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await _log(tmp_path)
    assert cli(["check", "memory://x", PCHANNEL]) == 2
    assert "file://" in capsys.readouterr().err
    assert cli(["check", f"file://{tmp_path}", "nope"]) == 2
    assert cli(["check", f"file://{tmp_path}", PCHANNEL, "--force"]) == 2
    assert os.listdir(tmp_path / PCHANNEL)
