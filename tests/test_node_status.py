"""Operating a node: its status (``Status``/``StatusIs``, ``NodeServer.status``,
``walsvc status``), pressure on a stalled stream, its bearer token (``walsvc serve
--token-file``) and the typed refusals a client gets. A node in a subprocess, clients
over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from _chain_support import take
from _node_process import node_process

import walsvc
from walsvc import DeliverPolicy, Filter, Message
from walsvc.apps._cli import main
from walsvc.apps._status_command import format_status
from walsvc.remote._node_status import ConnectionStatus, NodeStatus, PchannelStatus, StreamStatus
from walsvc.remote._status import fetch_status
from walsvc.service._status import fit_in_frame, masked_url

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def node(token_file: Path) -> Iterator[str]:
    """A node on memory:// demanding the token of ``token_file``; yields its URL."""
    url = f"memory://status-{uuid.uuid4().hex[:8]}"
    with node_process(url, "--token-file", str(token_file), env={"WALSVC_TOKEN": ""}) as (
        node_url,
        _,
    ):
        yield node_url


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def test_the_token_of_a_file_is_demanded_and_refusals_are_typed(node: str) -> None:
    for token in (None, "wrong"):
        with pytest.raises(walsvc.Unauthenticated, match="refused the connection"):
            await walsvc.open_wal(node, _pchannel(), token=token)
    with pytest.raises(walsvc.UnsupportedVersion, match=r"versions 1\.\.3.*speaks 7\.\.9"):
        await walsvc.open_wal(node, _pchannel(), token=TOKEN, versions=(7, 9))
    assert issubclass(walsvc.Unauthenticated, walsvc.WALError)
    assert not walsvc.Unauthenticated.retriable
    async with await walsvc.open_wal(node, _pchannel(), token=TOKEN) as wal:
        assert (await wal.append(Message(payload=b"x", vchannel="v"))).timetick > 0


@pytest.mark.parametrize("content", [None, "", "\n  \n"])
def test_a_token_file_that_is_missing_or_empty_is_a_usage_error(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    argv = ["serve", "--url", "memory://t", "--listen", "127.0.0.1:0", "--token-file", str(path)]
    assert main(argv) == 2
    assert "error: --token-file" in capsys.readouterr().err


async def _status(node: str) -> NodeStatus:
    async with asyncio.timeout(30):
        return await fetch_status(node, token=TOKEN)


def _streams_of(status: NodeStatus, pchannel: str) -> list[tuple[ConnectionStatus, StreamStatus]]:
    return [(c, s) for c in status.connections for s in c.streams if s.pchannel == pchannel]


async def _until(node: str, ready: Callable[[NodeStatus], bool]) -> NodeStatus:
    """The node's status once ``ready`` holds for it (polled)."""
    async with asyncio.timeout(30):
        while True:  # the node's state is polled over the wire: no event to wait for
            status = await _status(node)
            if ready(status):
                return status
            await asyncio.sleep(0.02)


async def test_the_status_shows_the_node_its_pchannels_connections_and_streams(
    node: str,
) -> None:
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel, token=TOKEN) as wal:
        results = await wal.append_many(
            [Message(payload=b"m", vchannel=f"v{i % 2}") for i in range(10)]
        )
        scanner = wal.read(DeliverPolicy.all(), [Filter(vchannels=["v1"])])
        assert len(await take(scanner, 5)) == 5
        status = await _status(node)
        assert status.version
        assert (status.min_version, status.max_version) == (1, 3)
        assert status.url.startswith("memory://status-")
        assert node == f"walsvc://{status.listen}"
        assert not status.draining
        assert status.uptime >= 0
        assert status.limits == walsvc.NodeLimits()
        (channel,) = [p for p in status.pchannels if p.pchannel == pchannel]
        assert channel.term == wal.term
        assert channel.last_timetick >= results[-1].timetick
        assert channel.latest_message_id == results[-1].message_id.marshal()
        assert channel.handles == 1
        ((connection, stream),) = _streams_of(status, pchannel)
        assert [(h.pchannel, h.read_only) for h in connection.handles] == [(pchannel, False)]
        assert connection.peer.startswith("127.0.0.1:")
        assert connection.connected_at <= status.started_at + status.uptime
        assert connection.in_flight == 0
        assert connection.version == 3
        assert (stream.deliver, stream.filter) == ("all", "vchannels=v1")
        assert stream.delivered == 5
        assert stream.credit_messages == 4096 - 5  # the reader grants more after half
        assert stream.credit_bytes == 8 * 1024 * 1024 - 5
        assert not stream.waiting_for_credit
        ours = [c for c in status.connections if not c.handles]
        assert [c.in_flight for c in ours] == [1]  # the status request's own connection
        await scanner.aclose()
    status = await _status(node)
    assert [p.handles for p in status.pchannels if p.pchannel == pchannel] == [0]
    assert _streams_of(status, pchannel) == []


async def test_a_stalled_stream_shows_pressure_while_others_go_on(node: str) -> None:
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel, token=TOKEN) as writer,
        await walsvc.open_wal(node, pchannel, token=TOKEN, read_only=True) as other,
        await walsvc.open_wal(
            node, pchannel, token=TOKEN, read_only=True, window_messages=10
        ) as stalled_wal,
    ):
        stalled = stalled_wal.read()  # its reader never consumes
        flowing = other.read()
        await writer.append_many([Message(payload=b"a", vchannel="v") for _ in range(100)])
        assert len(await take(flowing, 100)) == 100

        def pressed(status: NodeStatus) -> bool:
            return any(
                s.waiting_for_credit and s.delivered == 10 for _, s in _streams_of(status, pchannel)
            )

        status = await _until(node, pressed)
        streams = sorted(
            (s.delivered, s.waiting_for_credit) for _, s in _streams_of(status, pchannel)
        )
        assert streams == [(10, True), (100, False)]
        (stalled_status,) = [s for _, s in _streams_of(status, pchannel) if s.delivered == 10]
        assert (stalled_status.credit_messages, stalled_status.credit_bytes) == (0, (8 << 20) - 10)
        for _ in range(3):  # the others go on; the stalled stream holds its window
            await writer.append_many([Message(payload=b"b", vchannel="v") for _ in range(50)])
            assert len(await take(flowing, 50)) == 50
        status = await _status(node)
        assert sorted(s.delivered for _, s in _streams_of(status, pchannel)) == [10, 250]
        rest = await take(stalled, 250)  # it resumes, missing nothing
        assert len(rest) == 250
        status = await _until(
            node,
            lambda st: not any(s.waiting_for_credit for _, s in _streams_of(st, pchannel)),
        )
        assert sorted(s.delivered for _, s in _streams_of(status, pchannel)) == [250, 250]
        await stalled.aclose()
        await flowing.aclose()


async def test_the_status_names_the_version_each_connection_speaks(node: str) -> None:
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel, token=TOKEN, versions=(1, 1)) as old,
        await walsvc.open_wal(node, pchannel, token=TOKEN) as new,
    ):
        assert (old.connection.version, new.connection.version) == (1, 3)
        status = await _status(node)
        named = [c for c in status.connections if any(h.pchannel == pchannel for h in c.handles)]
        assert sorted(c.version for c in named) == [1, 3]


async def test_a_status_too_big_for_a_frame_keeps_the_connections_that_fit(node: str) -> None:
    """A status answer never exceeds a frame (one that did would never arrive): the node
    keeps its first connections, each whole, and counts the others."""
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel, token=TOKEN) as one,
        await walsvc.open_wal(node, pchannel, token=TOKEN) as two,
    ):
        async with one.read(DeliverPolicy.all()), two.read(DeliverPolicy.all()):
            status = await _status(node)
    encode = msgspec.msgpack.encode
    assert len(status.connections) >= 3  # the two WALs and the status's own
    assert fit_in_frame(status, len(encode(status))) is status
    fitted = fit_in_frame(status, len(encode(status)) - 1)
    kept = len(fitted.connections)
    assert len(encode(fitted)) < len(encode(status))
    assert fitted.connections == status.connections[:kept]
    assert fitted.omitted_connections == len(status.connections) - kept >= 1
    assert (
        msgspec.structs.replace(fitted, connections=status.connections, omitted_connections=0)
        == status
    )
    bare = fit_in_frame(status, 1)  # what is not a connection always stays
    assert (bare.connections, bare.omitted_connections) == ([], len(status.connections))
    assert bare.pchannels == status.pchannels
    assert f"... and {fitted.omitted_connections} more connections" in format_status(fitted)
    assert "more connections" not in format_status(status)


async def test_a_status_asked_for_subscriptions_lists_them_with_their_readers(
    node: str,
) -> None:
    pchannel = _pchannel()

    def served(status: NodeStatus) -> PchannelStatus:
        (found,) = [p for p in status.pchannels if p.pchannel == pchannel]
        return found

    async with await walsvc.open_wal(node, pchannel, token=TOKEN) as wal:
        appended = await wal.append_many([Message(payload=b"x", vchannel="v0")] * 3)
        async with wal.read(
            DeliverPolicy.all(), [Filter(vchannels=["v0"])], subscription="s-a"
        ) as scanner:
            await scanner.ack(await anext(scanner))
            await scanner.flush()
            async with asyncio.timeout(30):
                status = await fetch_status(node, token=TOKEN, subscriptions=True)
            (listed,) = served(status).subscriptions or []
            assert (listed.name, listed.readers) == ("s-a", 1)
            assert listed.timetick == appended[0].timetick
            assert listed.scope == "vchannels ['v0'], types (any)"
        status = await fetch_status(node, token=TOKEN, subscriptions=True)
        assert [(s.name, s.readers) for s in served(status).subscriptions or []] == [("s-a", 0)]
        assert served(await _status(node)).subscriptions is None  # not asked for
        # A status too big for a frame without its connections drops the lists first.
        encode = msgspec.msgpack.encode
        bare = msgspec.structs.replace(status, connections=[])
        fitted = fit_in_frame(status, len(encode(bare)) - 1)
        assert all(p.subscriptions is None for p in fitted.pchannels)


def test_walsvc_status_prints_tables_or_json(
    node: str,
    token_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert main(["status", node, "--json", "--token-file", str(token_file)]) == 0
    status = msgspec.json.decode(capsys.readouterr().out, type=NodeStatus)
    assert f"walsvc://{status.listen}" == node
    monkeypatch.setenv("WALSVC_TOKEN", TOKEN)
    assert main(["status", node]) == 0
    out = capsys.readouterr().out
    for heading in ("serving  memory://status-", "limits   queue 64.0 MiB", "streams", "PEER"):
        assert heading in out
    assert json.loads(json.dumps(msgspec.to_builtins(status)))["url"] == status.url
    monkeypatch.setenv("WALSVC_TOKEN", "wrong")
    assert main(["status", node]) == 2
    assert "error: the node at" in capsys.readouterr().err
    assert main(["status", "http://nowhere"]) == 2
    assert "not a node URL" in capsys.readouterr().err


async def test_the_status_of_a_node_in_process_needs_no_open_wal() -> None:
    async with walsvc.serve(f"memory://{uuid.uuid4().hex[:8]}") as server:
        status = await server.status()
        assert (status.pchannels, status.connections, status.draining) == ([], [], False)
        assert node_url_of(status) == server.node_url
        remote = await fetch_status(server.node_url)
        assert len(remote.connections) == 1
    assert masked_url("kafka://user:secret@host:9092") == "kafka://user:***@host:9092"
    assert masked_url("file:///data/wal") == "file:///data/wal"


def node_url_of(status: NodeStatus) -> str:
    return f"walsvc://{status.listen}"
