"""A node that stops without dropping what it owes: ``NodeServer.drain`` (in this
process, over real sockets, with an interceptor that holds appends to catch them in
flight) and ``walsvc serve`` on SIGTERM (a subprocess under producers and a reader):
clients are told ``GoingAway``, every request received is answered, new ones fail with
``BackendUnavailable``, streams end, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from _node_process import node_process

import walsvc
from walsvc import AppendResult, Message
from walsvc.core._chain import AppendNext
from walsvc.remote._connection import Connection
from walsvc.remote._protocol import Status

PATIENCE = 30


class Gate:
    """An interceptor that holds every append until ``opened`` is set."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.held = 0

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        self.held += 1
        await self.opened.wait()
        return await call_next(message)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(PATIENCE):
        while not condition():  # noqa: ASYNC110 (another task or process changes it)
            await asyncio.sleep(0.005)


async def drain_stream(scanner: walsvc.Scanner) -> tuple[list[bytes], BaseException | None]:
    """The payloads a scanner yields until it fails, and how it failed."""
    got: list[bytes] = []
    try:
        async with asyncio.timeout(PATIENCE):
            async for message in scanner:
                got.append(message.payload)  # noqa: PERF401 (kept when the scanner fails)
    except walsvc.WALError as exc:
        return got, exc
    return got, None


async def log_of(url: str, pchannel: str) -> list[bytes]:
    """Every payload of a user's message in the log, read where the node ran."""
    async with await walsvc.open_wal(url, pchannel, read_only=True) as wal:
        latest = await wal.latest_message_id()
        if latest is None:
            return []
        payloads = []
        async with asyncio.timeout(PATIENCE):
            async for message in wal.read(raw=True):  # the last may be a TimeTick
                if not message.type.is_system:
                    payloads.append(message.payload)
                if message.message_id == latest:
                    return payloads
    raise AssertionError("unreachable")


async def test_a_drain_answers_what_it_received_and_refuses_the_rest() -> None:
    gate = Gate()
    log = f"memory://drain-{uuid.uuid4().hex[:8]}"
    async with walsvc.serve(log, interceptors=lambda: [gate]) as node:
        url = node.node_url
        wal = await walsvc.open_wal(url, "p0", reconnect_timeout=0)
        reader = await walsvc.open_wal(url, "p0", read_only=True, reconnect_timeout=0)
        stream = asyncio.create_task(drain_stream(reader.read()))
        held = [
            asyncio.create_task(wal.append(Message(payload=b"held-%d" % i, vchannel="v")))
            for i in range(5)
        ]
        await until(lambda: gate.held == 5)
        draining = asyncio.create_task(node.drain(PATIENCE))
        await until(lambda: wal.connection.going_away is not None)
        assert wal.connection.going_away == "node is shutting down"
        status = await node.status()
        assert status.draining
        assert sorted(c.in_flight for c in status.connections) == [0, 5]
        with pytest.raises(walsvc.BackendUnavailable, match="node is draining"):
            await wal.append(Message(payload=b"late", vchannel="v"))
        with pytest.raises(walsvc.BackendUnavailable, match="node is draining"):
            await wal.latest_message_id()
        with pytest.raises(walsvc.BackendUnavailable, match="cannot reach"):
            await walsvc.open_wal(url, "p0", connect_timeout=5, reconnect_timeout=0)
        assert not draining.done()  # it waits for the appends it holds
        gate.opened.set()
        results = await asyncio.gather(*held)  # answered, every one
        assert len({r.message_id for r in results}) == 5
        async with asyncio.timeout(PATIENCE):
            await draining
        delivered, ended = await stream
        assert isinstance(ended, walsvc.BackendUnavailable)
        assert set(delivered) <= {b"held-%d" % i for i in range(5)}
        await wal.aclose()
        await reader.aclose()
    assert sorted(await log_of(log, "p0")) == [b"held-%d" % i for i in range(5)]


async def test_a_drain_that_times_out_cuts_off_what_still_runs() -> None:
    gate = Gate()
    log = f"memory://drain-{uuid.uuid4().hex[:8]}"
    async with walsvc.serve(log, interceptors=lambda: [gate]) as node:
        wal = await walsvc.open_wal(node.node_url, "p0", reconnect_timeout=0)
        stuck = asyncio.create_task(wal.append(Message(payload=b"stuck", vchannel="v")))
        await until(lambda: gate.held == 1)
        async with asyncio.timeout(PATIENCE):
            await node.drain(0.2)  # the gate never opens: the drain ends anyway
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await stuck
        assert wal.connection.going_away is not None
        await node.drain()  # again: done already
        gate.opened.set()
        await wal.aclose()


async def test_sigterm_drains_under_producers_and_exits_0(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    with node_process(url, "--drain-timeout", "20") as (node_url, process):
        writer = await walsvc.open_wal(node_url, "p0", reconnect_timeout=0)
        reader = await walsvc.open_wal(node_url, "p0", read_only=True, reconnect_timeout=0)
        stream = asyncio.create_task(drain_stream(reader.read()))
        acked: list[bytes] = []
        refused: list[bytes] = []
        unknown: list[bytes] = []

        async def produce(name: str) -> None:
            for seq in range(10**6):
                if writer.connection.going_away is not None:
                    return  # the node said it goes away: stop sending it appends
                payload = f"{name}-{seq}".encode()
                try:
                    await writer.append(Message(payload=payload, vchannel=name))
                except walsvc.AppendOutcomeUnknown:
                    unknown.append(payload)
                    return
                except walsvc.BackendUnavailable:
                    refused.append(payload)
                    return
                acked.append(payload)

        producers = [asyncio.create_task(produce(f"w{n}")) for n in range(8)]
        await until(lambda: len(acked) >= 400)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(PATIENCE):
            await asyncio.gather(*producers)
            code = await asyncio.to_thread(process.wait, PATIENCE)
        assert code == 0
        assert process.stdout is not None
        out = process.stdout.read()
        assert "walsvc node draining (at most 20 s)" in out
        assert "walsvc node stopped" in out
        assert writer.connection.going_away == "node is shutting down"
        delivered, ended = await stream
        assert isinstance(ended, walsvc.BackendUnavailable)
        await writer.aclose()
        await reader.aclose()
    log = await log_of(url, "p0")
    assert len(set(log)) == len(log)  # nothing twice
    assert set(acked) <= set(log)  # every acknowledged append is there
    assert not set(refused) & set(log)  # a refused one is not
    assert set(delivered) <= set(log)


async def test_a_second_sigterm_cuts_the_drain_short() -> None:
    with node_process(f"memory://{uuid.uuid4().hex[:8]}", "--drain-timeout", "600") as (
        node_url,
        process,
    ):
        host, port = node_url.removeprefix("walsvc://").rsplit(":", 1)
        conn = await Connection.connect(host, int(port))

        async def ask_forever() -> None:
            """Status requests, one after another: a draining node is never left quiet."""
            with contextlib.suppress(walsvc.WALError):
                while True:
                    request = conn.next_id()
                    await conn.request(Status(request), request).future

        asking = asyncio.create_task(ask_forever())
        process.send_signal(signal.SIGTERM)
        await until(lambda: conn.going_away is not None)
        assert process.poll() is None  # it drains, and would for 600 s
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, PATIENCE) == 0
        async with asyncio.timeout(PATIENCE):
            await asyncio.gather(asking, return_exceptions=True)
        await conn.aclose()


async def test_a_node_closes_its_wals_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """``NodeServer.aclose`` closes the WALs of its pchannels together, so a node's close
    takes its slowest WAL's, not their sum: each close here waits until every one has
    begun (one after the other, the first would wait for ever)."""
    from walsvc.wal._wal import LocalWAL

    count = 3
    everyone_closing = asyncio.Barrier(count)
    plain_close = LocalWAL.aclose

    async def close_with_the_others(self: LocalWAL) -> None:
        await everyone_closing.wait()
        await plain_close(self)

    async with walsvc.serve(f"memory://{uuid.uuid4().hex[:8]}") as server:
        for i in range(count):
            async with await walsvc.open_wal(server.node_url, f"p{i}") as client:
                await client.append(Message(payload=b"x", vchannel="v"))
        assert len((await server.status()).pchannels) == count
        monkeypatch.setattr(LocalWAL, "aclose", close_with_the_others)
        async with asyncio.timeout(PATIENCE):
            await server.aclose()
    assert everyone_closing.n_waiting == 0
