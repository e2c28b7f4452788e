"""The examples users copy run as written: the first example of README's tour and of the
docs' Getting started page, and the docstring example of ``walsvc.testing.memory_wal``;
and what a default read delivers (the data you appended, not the WAL's own TimeTicks)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest
from _chain_support import FakeClock, member, open_manual

import scanners
from interceptors import TimetickSync
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.testing import memory_wal

_ROOT = Path(__file__).resolve().parent.parent


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
async def test_the_first_example_prints_the_appended_message(page: str, tmp_path: Path) -> None:
    first = _python_blocks((_ROOT / page).read_text())[0]
    assert 'open_wal("file://walsvc-data"' in first
    code = first.replace("file://walsvc-data", f"file://{tmp_path / 'data'}")
    lines = [line for line in code.splitlines() if not line.startswith("import")]
    body = "async def example():\n" + textwrap.indent("\n".join(lines), "    ")
    namespace: dict[str, object] = {}
    exec("import walsvc, scanners\n" + body, namespace)  # the page's code, as written
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        async with asyncio.timeout(30):
            await namespace["example"]()  # type: ignore[operator]
    printed = out.getvalue().split()
    assert printed[-1] == "b'...'", out.getvalue()  # the message appended, not a tick


async def test_the_memory_wal_docstring_example_runs() -> None:
    doc = memory_wal.__doc__
    assert doc is not None
    code = textwrap.dedent(doc.split("Example::", 1)[1])
    namespace: dict[str, object] = {}
    exec(code, namespace)  # the docstring's code, as written
    async with asyncio.timeout(30):
        await namespace["test_roundtrip"]()  # type: ignore[operator]


async def test_a_default_read_leaves_out_timeticks_and_timeticks_true_keeps_them() -> None:
    async with await memory_wal() as wal:
        sent = await wal.append(Message(payload=b"x", vchannel="v"))
        async with wal.read() as scanner:
            assert (await anext(scanner)).message_id == sent.message_id
        async with wal.read(timeticks=True) as scanner:
            assert (await anext(scanner)).type is MessageType.TIME_TICK  # the opening one
        async with wal.read(raw=True) as scanner:
            assert (await anext(scanner)).type is MessageType.TIME_TICK


async def test_a_tailing_reader_is_not_woken_with_idle_ticks(tmp_path: Path) -> None:
    clock = FakeClock()
    async with await open_manual(f"file://{tmp_path}", clock) as wal:
        sync = member(wal, TimetickSync)
        async with wal.read(DeliverPolicy.latest()) as scanner:
            waiting = asyncio.ensure_future(anext(scanner))
            await asyncio.sleep(0.01)
            for _ in range(5):
                clock.ms += 10
                await sync.sync_once()  # an idle tick each time: someone waits
                await asyncio.sleep(0.01)
            assert not waiting.done(), waiting.result()
            sent = await wal.append(Message(payload=b"now", vchannel="v"))
            async with asyncio.timeout(10):
                assert (await waiting).message_id == sent.message_id


async def test_a_subscription_on_a_quiet_vchannel_moves_on_over_the_ticks_it_leaves_out(
    tmp_path: Path,
) -> None:
    """Reader of vchannel A acks its one message; 50 appends on B follow, and their
    persisted TimeTick. Nothing more is delivered, yet the stored checkpoint moves past
    B's appends, so a restarted reader does not read B's share of the log again."""
    clock = FakeClock()
    url = f"file://{tmp_path}"
    async with await open_manual(url, clock) as wal:
        sync = member(wal, TimetickSync)
        mine = await wal.append(Message(payload=b"a", vchannel="A"))
        only_a = [scanners.vchannel("A")]
        async with wal.read(filters=only_a, subscription="s") as scanner:
            got = await anext(scanner)
            assert got.message_id == mine.message_id
            await scanner.ack(got)
            waiting = asyncio.ensure_future(anext(scanner))
            others = await wal.append_many([Message(payload=b"b", vchannel="B")] * 50)
            clock.ms += 10
            tick = await sync.sync_once()
            assert tick is not None
            assert tick > others[-1].timetick
            await asyncio.sleep(0.05)
            assert not waiting.done(), waiting.result()  # B's messages and the tick: not mine
        with contextlib.suppress(StopAsyncIteration):
            await waiting
        stored = await wal.backend.subscriptions().load("s")
    assert stored is not None
    assert stored.timetick >= others[-1].timetick, (stored, others[-1])
