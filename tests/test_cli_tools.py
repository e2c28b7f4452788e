"""``walsvc tail`` and ``walsvc inspect`` on every kind of log: file://, kafka:// (Tansu),
pulsar:// (Pulsar Lite) and walsvc:// (a node process), driven in-process through
``main(argv)`` (sync tests: ``main`` runs its own event loop) and, for signals and
pipes, as subprocesses.

Each log gets the same story (``_fill``): ten INSERTs over two vchannels, a DELETE with a
binary payload, a committed transaction, a subscription that acknowledged a message, a
transaction left open by a writer that closed, and one more INSERT. The tests check the
commands' output against what was appended.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _node_process import node_serving
from _pulsar_lite import broker
from _tansu import tansu_url

import walsvc
from walsvc import DeliverPolicy, Filter, Message, MessageType
from walsvc.apps import _cli

__all__ = ("broker", "tansu_url")  # fixtures, imported for pytest

HANG = 60.0  # a guard against hangs, never an assertion about speed
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Story:
    """What ``_fill`` appended, by marshalled id."""

    url: str
    pchannel: str
    inserts: list[tuple[str, str, bytes]] = field(default_factory=list)  # id, vchannel, payload
    delete_id: str = ""
    txn_id: int = 0  # the committed one
    txn_body_ids: list[str] = field(default_factory=list)
    acked_id: str = ""
    acked_tick: int = 0
    open_txn: int = 0
    after_id: str = ""


async def _fill(url: str, pchannel: str) -> Story:
    story = Story(url, pchannel)
    async with await walsvc.open_wal(url, pchannel) as wal:
        messages = [Message(payload=f"hello {i}".encode(), vchannel=f"v{i % 2}") for i in range(10)]
        results = await wal.append_many(messages)
        story.inserts = [
            (r.message_id.marshal(), m.vchannel, m.payload)
            for r, m in zip(results, messages, strict=True)
        ]
        deleted = await wal.append(
            Message(payload=bytes(range(40)), vchannel="v0", type=MessageType.DELETE)
        )
        story.delete_id = deleted.message_id.marshal()
        async with wal.txn("v1") as txn:
            story.txn_id = txn.txn_id
            body = await txn.append(Message(payload=b"in txn", vchannel="v1"))
            story.txn_body_ids.append(body.message_id.marshal())
        async with wal.read(
            DeliverPolicy.all(), [Filter(vchannels=["v0"])], subscription="sub-a"
        ) as scanner:
            seen = 0
            async for message in scanner:
                seen += 1
                if seen == 3:  # hello 4
                    await scanner.ack(message)
                    story.acked_id = message.message_id.marshal()
                    story.acked_tick = message.timetick
                    break
        left_open = await wal.begin_txn("v0", keepalive=120)
        story.open_txn = left_open.txn_id
        await left_open.append(Message(payload=b"open body", vchannel="v0"))
        after = await wal.append(Message(payload=b"after", vchannel="v1"))
        story.after_id = after.message_id.marshal()
    return story


def _fresh() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def file_story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    url = f"file://{tmp_path_factory.mktemp('cli-tools')}"
    return asyncio.run(_fill(url, "p0"))


@pytest.fixture(scope="module")
def kafka_story(tansu_url: str) -> Story:
    return asyncio.run(_fill(tansu_url, _fresh()))


@pytest.fixture(scope="module")
def pulsar_story(broker: Any) -> Story:
    return asyncio.run(_fill(broker.url, _fresh()))


@pytest.fixture(scope="module")
def node_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with node_serving("file", tmp_path_factory.mktemp("cli-node")) as url:
        yield url


@pytest.fixture(scope="module")
def node_story(node_url: str) -> Story:
    return asyncio.run(_fill(node_url, "p0"))


STORIES = ["file_story", "kafka_story", "pulsar_story", "node_story"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = _cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _tail_json(capsys: pytest.CaptureFixture[str], story: Story, *args: str) -> list[Any]:
    status, out, err = _run(
        capsys, "tail", story.url, story.pchannel, "--no-follow", "--json", *args
    )
    assert (status, err) == (0, "")
    return [json.loads(line) for line in out.splitlines()]


# ---------------------------------------------------------------------------------------
# tail


@pytest.mark.parametrize("story_name", STORIES)
def test_tail_prints_the_log(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, story_name: str
) -> None:
    story: Story = request.getfixturevalue(story_name)
    got = _tail_json(capsys, story)
    # The user's messages in log order; TimeTicks and txn control are left out.
    expected_ids = [i for i, _, _ in story.inserts] + [story.delete_id]
    assert [m["id"] for m in got[:11]] == expected_ids
    for message, (_, vchannel, payload) in zip(got, story.inserts, strict=False):
        assert (message["vchannel"], message["type"]) == (vchannel, "INSERT")
        assert base64.b64decode(message["payload_base64"]) == payload
    assert got[10]["type"] == "DELETE"
    assert base64.b64decode(got[10]["payload_base64"]) == bytes(range(40))
    txn = got[11]
    assert (txn["type"], txn["txn"], txn["vchannel"]) == ("TXN", story.txn_id, "v1")
    assert [b["id"] for b in txn["body"]] == story.txn_body_ids
    assert got[-1]["id"] == story.after_id  # the open transaction is not delivered
    assert len(got) == 13
    ticks = [m["timetick"] for m in got]
    assert ticks == sorted(ticks)

    # The same as text: one line per message (and the transaction's body, indented).
    status, out, err = _run(capsys, "tail", story.url, story.pchannel, "--no-follow")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 14
    first = lines[0].split("  ")
    assert first[0] == story.inserts[0][0]
    assert first[1] == str(got[0]["timetick"])
    assert first[3:] == ["v0", "INSERT", "7 B", '"hello 0"']
    assert lines[10].split("  ")[3:] == [
        "v0",
        "DELETE",
        "40 B",
        "0x000102030405060708090a0b0c0d0e0f...",
    ]
    assert lines[11].split("  ")[3:6] == ["v1", "TXN", "1 msgs, 6 B"]
    assert lines[12].startswith(f"  {story.txn_body_ids[0]}  ")


@pytest.mark.parametrize("story_name", STORIES)
def test_tail_filters_and_starts(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, story_name: str
) -> None:
    story: Story = request.getfixturevalue(story_name)
    v1_inserts = [i for i, v, _ in story.inserts if v == "v1"]
    got = _tail_json(capsys, story, "--vchannel", "v1", "--type", "insert")
    assert [m["id"] for m in got if m["type"] == "INSERT"] == [*v1_inserts, story.after_id]
    assert {m["vchannel"] for m in got} == {"v1"}
    # Every vchannel's DELETEs; a DELETE filter passes no INSERT.
    got = _tail_json(capsys, story, "--type", "DELETE", "--vchannel", "v0", "--vchannel", "v1")
    assert [m["id"] for m in got] == [story.delete_id]
    # --from is inclusive and takes the id as printed; --count stops.
    start = story.inserts[4][0]
    got = _tail_json(capsys, story, "--from", start, "--count", "3")
    assert [m["id"] for m in got] == [i for i, _, _ in story.inserts[4:7]]
    # --system: the log as stored, TimeTicks and transaction control too.
    got = _tail_json(capsys, story, "--system", "--type", "TIME_TICK")
    types = {m["type"] for m in got}
    assert {"TIME_TICK", "BEGIN_TXN", "COMMIT_TXN"} <= types
    assert "INSERT" not in types


def test_tail_raw_writes_payloads(capsys: pytest.CaptureFixture[str], file_story: Story) -> None:
    story = file_story
    status, out, err = _run(
        capsys, "tail", story.url, story.pchannel, "--no-follow", "--raw", "--vchannel", "v1"
    )
    assert (status, err) == (0, "")
    assert out == "hello 1\nhello 3\nhello 5\nhello 7\nhello 9\nin txn\nafter\n"


def test_tail_follows_new_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    asyncio.run(_fill(url, "p0"))
    stop = threading.Event()
    appended: list[str] = []

    def append_until_stopped() -> None:
        async def run() -> None:
            async with await walsvc.open_wal(url, "p0") as wal:
                while not stop.is_set():
                    result = await wal.append(Message(payload=b"new", vchannel="v9"))
                    appended.append(result.message_id.marshal())
                    await asyncio.sleep(0.05)

        asyncio.run(run())

    appender = threading.Thread(target=append_until_stopped)
    appender.start()
    try:
        status, out, err = _run(
            capsys,
            "tail",
            url,
            "p0",
            "--latest",
            "--vchannel",
            "v9",
            "--count",
            "3",
            "--json",
            "--timeout",
            "30",
        )
    finally:
        stop.set()
        appender.join(HANG)
    assert (status, err) == (0, "")
    ids = [json.loads(line)["id"] for line in out.splitlines()]
    assert len(ids) == 3
    at = appended.index(ids[0])
    assert ids == appended[at : at + 3]
    # --timeout ends a quiet follow with status 0.
    status, out, err = _run(capsys, "tail", url, "p0", "--latest", "--timeout", "0.2")
    assert (status, out, err) == (0, "", "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tail", "bogus://x", "p0"], "error: no walsvc backend for scheme 'bogus'; known: "),
        (["inspect", "bogus://x", "p0"], "error: no walsvc backend for scheme 'bogus'; known: "),
        (["tail", "{file}"], "the following arguments are required: pchannel"),
        (["inspect", "{file}"], "the following arguments are required: pchannel"),
        (["tail", "{file}", "nope"], "error: no file WAL for pchannel 'nope' at "),
        (["inspect", "{file}", "nope"], "error: no file WAL for pchannel 'nope' at "),
        (["tail", "{file}", "p0", "--from", "file:x"], "error: --from: 'x' is not a file"),
        (["tail", "{file}", "p0", "--from", "12"], "error: --from: '12' is not a marshalled"),
        (["tail", "{file}", "p0", "--from", "kafka:3"], "error: --from kafka:3: this log's ids"),
        (["tail", "{file}", "p0", "--type", "FOO"], "argument --type: 'FOO' is not a message"),
        (["tail", "{file}", "p0", "--count", "0"], "argument --count: must be at least 1"),
        (["tail", "{file}", "p0", "--token-file", "t"], "error: --token-file is for walsvc://"),
        (["tail", "{file}", "p0", "--latest", "--from", "file:1"], "not allowed with argument"),
    ],
)
def test_bad_input_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], file_story: Story, args: list[str], message: str
) -> None:
    argv = [a.replace("{file}", file_story.url) for a in args]
    status, out, err = _run(capsys, *argv)
    assert (status, out) == (2, "")
    assert message in err
    assert "Traceback" not in err


def _subprocess(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "walsvc", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_tail_ends_quietly_on_sigint_and_on_a_closed_pipe(tmp_path: Path) -> None:
    # A log of its own: the writer below would roll back the stories' open transaction.
    url = f"file://{tmp_path}"
    story = asyncio.run(_fill(url, "p0"))
    process = _subprocess("tail", url, "p0")
    assert process.stdout is not None
    assert process.stdout.readline().startswith(story.inserts[0][0] + "  ")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=HANG)
    assert (process.returncode, err) == (130, "")

    # A reader that goes away (| head): the next write finds the pipe closed.
    process = _subprocess("tail", url, "p0", "--timeout", "5")
    assert process.stdout is not None
    process.stdout.readline()
    process.stdout.close()

    async def more() -> None:
        async with await walsvc.open_wal(url, "p0") as wal:
            await wal.append_many([Message(payload=b"x" * 4096, vchannel="v0")] * 64)

    asyncio.run(more())
    assert process.wait(timeout=HANG) == 0
    assert process.stderr is not None
    assert process.stderr.read() == ""
    process.stderr.close()


# ---------------------------------------------------------------------------------------
# inspect


def _inspect(capsys: pytest.CaptureFixture[str], story: Story) -> dict[str, Any]:
    status, out, err = _run(capsys, "inspect", story.url, story.pchannel, "--json")
    assert (status, err) == (0, "")
    report: dict[str, Any] = json.loads(out)
    return report


def _seq(marshalled: str) -> int:
    return int(marshalled.split(":")[1])


@pytest.mark.parametrize("story_name", ["file_story", "kafka_story", "pulsar_story"])
def test_inspect_a_local_log(
    capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, story_name: str
) -> None:
    story: Story = request.getfixturevalue(story_name)
    report = _inspect(capsys, story)
    newest = report["newest"]
    assert report["latest_id"] == newest["id"]
    # What the story's writer left: the newest record is its last append or a TimeTick
    # after it; the first is its opening TimeTick (or, on kafka, its barrier's record).
    assert newest["term"] >= 1
    assert report["writer"]["newest_record_term"] == newest["term"]
    (txn,) = report["open_transactions"]
    assert (txn["txn_id"], txn["vchannel"], txn["bodies"], txn["body_bytes"]) == (
        story.open_txn,
        "v0",
        1,
        len(b"open body"),
    )
    (sub,) = report["subscriptions"]
    assert sub["name"] == "sub-a"
    assert sub["timetick"] == story.acked_tick
    assert sub["ticks_behind"] == newest["timetick"] - story.acked_tick
    assert sub["scope"] == "vchannels ['v0'], types (any)"
    if story_name == "pulsar_story":
        assert report["records"] is None  # Pulsar ids do not count records
        assert sub["records_behind"] is None
    else:
        # Every record after the acknowledged one, to the newest.
        assert sub["records_behind"] == _seq(newest["id"]) - _seq(story.acked_id)
        assert report["records"] == _seq(newest["id"]) - _seq(report["first"]["id"]) + 1
    status, out, err = _run(capsys, "inspect", story.url, story.pchannel)
    assert (status, err) == (0, "")
    rows = [line.split() for line in out.splitlines()]
    assert [str(story.open_txn), "v0", txn["begin_id"]] in [row[:3] for row in rows]
    assert ["sub-a", sub["checkpoint"]] in [row[:2] for row in rows]
    if story_name == "pulsar_story":
        assert report["routing"] == "unknown"
        assert "routing    unknown (not looked up" in out
    else:
        assert report["routing"] is None
        assert "routing    none" in out


def test_inspect_file_segments_and_head(
    capsys: pytest.CaptureFixture[str], file_story: Story
) -> None:
    report = _inspect(capsys, file_story)
    file = report["file"]
    path = Path(file_story.url.removeprefix("file://")) / "p0"
    assert file["path"] == str(path)
    segments = sorted(p for p in path.iterdir() if p.suffix == ".seg")
    assert [s["path"] for s in file["segments"]] == [str(p) for p in segments]
    assert [s["bytes"] for s in file["segments"]] == [p.stat().st_size for p in segments]
    assert file["bytes"] == sum(p.stat().st_size for p in segments)
    assert file["durable_end"] == _seq(report["latest_id"]) + 1
    assert report["first"]["id"] == f"file:{file['first_seq']}"
    assert report["writer"]["head_term"] >= report["writer"]["newest_record_term"]
    assert report["writer"]["opened_by"].startswith("pid ")
    status, out, err = _run(capsys, "inspect", file_story.url, "p0")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"pchannel   p0 at {file_story.url}"
    assert lines[1].startswith(f"records    {report['records']:,} retained; latest id file:")
    plural = "" if len(segments) == 1 else "s"
    assert any(line.startswith(f"segments   {len(segments)} file{plural}, ") for line in lines)


def test_inspect_a_node(capsys: pytest.CaptureFixture[str], node_story: Story) -> None:
    report = _inspect(capsys, node_story)
    node = report["node"]
    assert node["url"].startswith("file://")
    served = node["pchannel"]
    assert served is not None
    assert served["term"] == report["writer"]["node_term"] >= 1
    # The node holds the transaction its client left open (it outlives the client).
    (txn,) = report["open_transactions"]
    assert (txn["txn_id"], txn["bodies"]) == (node_story.open_txn, 1)
    # The node lists the pchannel's durable subscriptions; their lag in records is
    # not known over the wire.
    (sub,) = report["subscriptions"]
    assert (sub["name"], sub["timetick"], sub["readers"]) == ("sub-a", node_story.acked_tick, 0)
    assert sub["ticks_behind"] == report["newest"]["timetick"] - node_story.acked_tick > 0
    assert sub["ms_behind"] >= 0
    assert sub["scope"] == "vchannels ['v0'], types (any)"
    assert sub["records_behind"] is None
    # Not reported by a node: unknown, not made up.
    assert report["file"] is None
    assert report["routing"] is None  # read through the node: none stored yet
    status, out, err = _run(capsys, "inspect", node_story.url, "p0")
    assert (status, err) == (0, "")
    assert ["sub-a", sub["checkpoint"]] in [line.split()[:2] for line in out.splitlines()]
    assert "routing    none" in out
    assert "segments   unknown (the node does not report them)" in out

    async def route() -> None:  # a routing stored through the node, in the node's log
        node = await walsvc.open_node(node_story.url, ["r0", "r1"])
        await node.aclose()

    asyncio.run(route())
    routing = _inspect(capsys, node_story)["routing"]
    assert (routing["version"], routing["pchannels"]) == (1, ["r0", "r1"])
    # A pchannel no client had open: the node opens it for the inspection, then says.
    untouched = _inspect(capsys, Story(node_story.url, f"untouched-{uuid.uuid4().hex[:6]}"))
    assert untouched["node"]["pchannel"] is not None
    assert untouched["subscriptions"] == []


def test_inspect_an_empty_log_and_a_routing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"

    async def prepare() -> None:
        async with await walsvc.open_wal(url, "empty", interceptors=[]):
            pass
        node = await walsvc.open_node(url, ["n0", "n1"])
        await node.aclose()

    asyncio.run(prepare())
    report = _inspect(capsys, Story(url, "empty"))
    assert (report["first"], report["newest"], report["records"]) == (None, None, 0)
    assert (report["open_transactions"], report["subscriptions"]) == ([], [])
    assert report["routing"]["version"] == 1
    assert report["routing"]["pchannels"] == ["n0", "n1"]


async def test_a_read_only_scanner_reports_how_far_it_read(tmp_path: Path) -> None:
    """What ``tail --no-follow`` relies on when the filter drops the log's last records:
    a read-only WAL's scanner reports its backend scanner's position while it waits."""
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p0") as wal:
        kept = await wal.append(Message(payload=b"kept", vchannel="v0"))
        await wal.append_many([Message(payload=b"dropped", vchannel="v1")] * 5)
    async with await walsvc.open_wal(url, "p0", read_only=True) as reader:
        latest = await reader.latest_message_id()
        assert latest is not None
        async with reader.read(DeliverPolicy.all(), [Filter(vchannels=["v0"])]) as scanner:
            message = await anext(scanner)
            assert message.message_id == kept.message_id
            waiting = asyncio.ensure_future(anext(scanner))
            async with asyncio.timeout(HANG):
                while scanner.stats().position != latest:  # noqa: ASYNC110 (a snapshot: nothing signals it)
                    await asyncio.sleep(0.01)
            assert not waiting.done()  # nothing more for v0
            waiting.cancel()
            await asyncio.wait((waiting,))
