"""``walsvc demo``: the main job, run in-process through ``main(argv)``.

``main`` starts its own event loop, so these are plain sync tests; the loop matrix is
covered by running the demo on uvloop and, with uvloop hidden, on the stock loop.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import walsvc
from walsvc.apps import _cli
from walsvc.backends import _memory

# Evenly divisible, so every vchannel gets exactly MESSAGES / VCHANNELS messages.
MESSAGES, PRODUCERS, VCHANNELS = 2048, 8, 4
SMALL = (
    "--messages",
    str(MESSAGES),
    "--producers",
    str(PRODUCERS),
    "--vchannels",
    str(VCHANNELS),
    "--payload-size",
    "40",
    "--no-progress",
)

_OPEN = re.compile(
    r"^open +[\d.]+ s  (\S+), pchannel (\S+), term (\d+): ([\d,]+) records in the log$"
)
_APPEND = re.compile(
    r"^append +[\d.]+ s  ([\d,]+) msgs x (\d+) B, (\d+) producers, (\d+) vchannels"
)
_RATE = re.compile(
    r"^ +[\d,]+ msgs/s +[\d.,]+ MB/s +ack latency p50 [\d.]+ [mu]s +p99 [\d.]+ [mu]s$"
)
_READ = re.compile(
    r"^read +[\d.]+ s  filter vchannel-0: ([\d,]+) msgs, all in order; [\d,]+ records/s$"
)
_REOPEN = re.compile(r"^reopen +[\d.]+ s  read-only: ([\d,]+) msgs intact, last ack (\S+)")
_OK = re.compile(r"^OK: ([\d,]+) msgs acked, .* the log holds ([\d,]+) records\)$")


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    status = _cli.main(["demo", *args])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def _check_ok_run(lines: list[str], *, before: int, url: str, scheme: str) -> None:
    """The output of a successful run says, consistently, what it wrote and verified.

    ``before`` counts the records earlier runs left; each open adds its TimeTick, and the
    timetick sync adds one now and then, so record counts are lower bounds."""
    assert 8 <= len(lines) <= 12, lines
    assert lines[0].startswith("walsvc demo: ")
    by_step = {line.split(maxsplit=1)[0]: line for line in lines if not line.startswith(" ")}
    opened = _OPEN.match(by_step["open"])
    assert opened, by_step["open"]
    assert (opened[1], opened[2]) == (url, "demo-0")
    held = _number(opened[4])
    assert held >= before + 1  # the opening TimeTick
    appended = _APPEND.match(by_step["append"])
    assert appended, by_step["append"]
    assert [_number(g) for g in appended.groups()] == [MESSAGES, 40, PRODUCERS, VCHANNELS]
    assert any(_RATE.match(line) for line in lines), lines
    read = _READ.match(by_step["read"])
    assert read, by_step["read"]
    assert _number(read[1]) == MESSAGES // VCHANNELS
    reopened = _REOPEN.match(by_step["reopen"])
    assert reopened, by_step["reopen"]
    assert _number(reopened[1]) == MESSAGES
    scheme_of_last, last_ack = reopened[2].split(":")
    assert scheme_of_last == scheme
    assert int(last_ack) >= held + MESSAGES - 1
    ok = _OK.match(lines[-1])
    assert ok, lines[-1]
    assert _number(ok[1]) == MESSAGES
    assert _number(ok[2]) >= held + MESSAGES


@pytest.fixture
def memory_url() -> str:
    return f"memory://cli-{uuid.uuid4().hex}"


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_demo_on_memory(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    memory_url: str,
    loop: str,
) -> None:
    if loop == "asyncio":
        monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    status, lines, err = _demo(capsys, "--url", memory_url, *SMALL)
    assert (status, err) == (0, "")
    assert lines[0].startswith(f"walsvc demo: {loop} ")
    _check_ok_run(lines, before=0, url=memory_url, scheme="memory")


@pytest.mark.parametrize("sync", ["always", "none"])
def test_demo_on_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, sync: str) -> None:
    url = f"file://{tmp_path / 'data'}"
    status, lines, err = _demo(capsys, "--url", url, "--sync", sync, *SMALL)
    assert (status, err) == (0, "")
    _check_ok_run(lines, before=0, url=url, scheme="file")
    assert lines[2].endswith(f", sync={sync}")


def test_second_run_appends_to_the_first(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'data'}"
    assert _demo(capsys, "--url", url, *SMALL)[0] == 0
    status, lines, err = _demo(capsys, "--url", url, *SMALL)
    assert (status, err) == (0, "")
    _check_ok_run(lines, before=MESSAGES, url=url, scheme="file")
    assert "term 2:" in lines[1]


def test_relative_file_url_and_fresh(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = "file://walsvc-data"
    assert _demo(capsys, "--url", url, *SMALL)[0] == 0
    assert (tmp_path / "walsvc-data" / "demo-0" / "head").is_file()
    status, lines, err = _demo(capsys, "--url", url, "--fresh", *SMALL)
    assert (status, err) == (0, "")
    _check_ok_run(lines, before=0, url=url, scheme="file")


def test_demo_on_a_log_truncated_to_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"

    async def fill_and_truncate() -> None:
        async with await walsvc.open_wal(url, "demo-0") as wal:
            messages = [walsvc.Message(payload=b"old", vchannel="vchannel-0")] * 3
            results = await wal.append_many(messages)
            await wal.truncate(results[-1].message_id)

    asyncio.run(fill_and_truncate())
    status, lines, err = _demo(capsys, "--url", url, *SMALL)
    assert (status, err) == (0, "")
    # What is left: this open's TimeTick (and one of the timetick sync, if it ran
    # between the truncation and the close).
    held = _OPEN.match(lines[1])
    assert held, lines[1]
    assert _number(held[4]) in (1, 2), lines[1]
    reopened = _REOPEN.match(lines[-2])
    assert reopened, lines[-2]
    assert int(reopened[2].split(":")[1]) >= 4 + MESSAGES, lines[-2]
    ok = _OK.match(lines[-1])
    assert ok, lines[-1]
    assert _number(ok[2]) >= MESSAGES + 1, lines[-1]


def test_fresh_refuses_a_directory_that_is_not_a_log(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    status, lines, err = _demo(capsys, "--url", f"file://{tmp_path}", "--fresh", *SMALL)
    assert status == 2
    assert lines == []
    assert err.startswith("error: --fresh: ")
    assert "holds 'notes.txt', which is not a walsvc pchannel; not deleting it" in err
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_fresh_refuses_a_url_that_is_not_a_file_log(
    capsys: pytest.CaptureFixture[str], memory_url: str
) -> None:
    status, _, err = _demo(capsys, "--url", memory_url, "--fresh", *SMALL)
    assert status == 2
    assert (
        err == f"error: --fresh deletes a file:// log's directory; it cannot clear {memory_url}\n"
    )


def test_unknown_scheme_is_an_error_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _demo(capsys, "--url", "bogus://x", *SMALL)
    assert status == 2
    assert err.startswith("error: no walsvc backend for scheme 'bogus'; known: ")
    assert err.count("\n") == 1  # one line, no traceback


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, err = _demo(capsys, "--messages", "0")
    assert (status, lines) == (2, [])
    assert "argument --messages: must be at least 1, not 0" in err
    assert _demo(capsys, "--payload-size", "15")[0] == 2
    assert _cli.main([]) == 2
    assert _cli.main(["demo", "--help"]) == 0
    assert "--no-progress" in capsys.readouterr().out


def test_a_log_that_loses_an_acked_message_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, memory_url: str
) -> None:
    real_append = _cli._append

    async def append_then_lose_one(
        wal: walsvc.WAL, workload: _cli._Workload, progress: bool
    ) -> _cli._Appended:
        appended = await real_append(wal, workload, progress)
        # Message 100 silently becomes a second copy of message 99.
        log = _memory._logs[(memory_url.removeprefix("memory://"), "demo-0")]
        records = log.records.run(0, len(log.records))
        records[100] = records[99]
        log.records = _memory._Records()
        log.records.extend(records)
        return appended

    monkeypatch.setattr(_cli, "_append", append_then_lose_one)
    status, lines, err = _demo(capsys, "--url", memory_url, *SMALL)
    assert (status, err) == (1, "")
    assert re.fullmatch(
        r"FAILED: message memory:\d+: producer \d+'s message \d+ (is missing|again).*", lines[-1]
    )
    assert not any(line.startswith("OK") for line in lines)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tqdm_installed", [True, False])
def test_progress_bar_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    memory_url: str,
    tqdm_installed: bool,
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    if not tqdm_installed:
        monkeypatch.setitem(sys.modules, "tqdm", None)
    args = [a for a in SMALL if a != "--no-progress"]
    status = _cli.main(["demo", "--url", memory_url, *args])
    assert status == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("OK: ")
    shown = terminal.getvalue()
    # A bar for each long step: the appends, the filtered read, the check after reopening.
    for step in ("append", "read", "verify"):
        assert (f"{step}:" in shown) is tqdm_installed, shown


def _repo_root() -> str:
    return str(Path(walsvc.__file__).resolve().parent.parent)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(lambda: [sys.executable, "-m", "walsvc"], id="python -m walsvc"),
        pytest.param(lambda: [str(Path(sys.executable).with_name("walsvc"))], id="walsvc"),
    ],
)
def test_command_line_entry_points(command: Callable[[], list[str]], tmp_path: Path) -> None:
    argv = command()
    if not Path(argv[0]).exists():
        pytest.fail(f"{argv[0]} is missing: install the package (pip install -e .)")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [_repo_root(), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [*argv, "demo", *SMALL],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    _check_ok_run(lines, before=0, url="file://walsvc-data", scheme="file")
    assert (tmp_path / "walsvc-data" / "demo-0" / "head").is_file()
