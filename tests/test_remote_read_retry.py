"""A read the node cannot serve for a moment: the node's scanner failed (its backend
unreachable) while the connection stays up, so the node ends the stream with
``BACKEND_UNAVAILABLE`` without going away. A client that reconnects sends the stream's
``Read`` again on the same socket, with backoff, and the reader sees every message once,
in order; past ``reconnect_timeout`` it gets the error, as a local reader would at once.
Before, the client kept such a stream for a next socket that never came: the reader
waited for good.

The faults come from ``tests/_faulty.py`` (a memory backend whose scanners fail on
command), served in-process over a real socket; the node keeps no tail cache, so every
read goes to the backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import _faulty
import pytest

import walsvc
from walsvc import DeliverPolicy, Message, MessageType

COUNT = 20


@pytest.fixture
async def node() -> AsyncIterator[str]:
    _faulty.register()
    async with walsvc.serve(f"{_faulty.SCHEME}://{uuid.uuid4().hex}", tail_cache_bytes=0) as server:
        yield server.node_url
    _faulty.FaultyBackend.read_faults.clear()


async def _appended(node: str, pchannel: str) -> None:
    async with await walsvc.open_wal(node, pchannel) as wal:
        await wal.append_many([Message(payload=b"%d" % i, vchannel="v") for i in range(COUNT)])


async def _payloads(scanner: walsvc.Scanner, *, ack: bool) -> list[int]:
    got: list[int] = []
    async with asyncio.timeout(20):
        async for message in scanner:
            if message.type is MessageType.INSERT:
                got.append(int(message.payload))
                if ack:
                    await scanner.ack(message)
                if len(got) == COUNT:
                    break
    return got


@pytest.mark.parametrize("subscription", [None, "s"])
async def test_a_read_the_node_cannot_serve_for_a_moment_goes_on(
    node: str, subscription: str | None
) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan = ["ok"] * 5 + ["unavailable"] * 4 + ["ok"] * 3 + ["unavailable"]
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=10) as wal:
        scanner = wal.read(DeliverPolicy.all(), subscription=subscription)
        async with scanner:
            got = await _payloads(scanner, ack=subscription is not None)
    assert got == list(range(COUNT))
    assert plan == []  # every injected failure was met


async def test_a_read_the_node_cannot_serve_ends_after_reconnect_timeout(node: str) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    _faulty.FaultyBackend.read_faults[pchannel] = ["ok"] * 3 + ["unavailable"] * 10_000
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=0.5) as wal:
        async with wal.read(DeliverPolicy.all()) as scanner:
            with pytest.raises(walsvc.BackendUnavailable, match="read again"):
                await _payloads(scanner, ack=False)
        assert await wal.latest_message_id() is not None  # the connection is fine


async def test_without_reconnecting_a_failed_read_ends_at_once(node: str) -> None:
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan = ["ok", "unavailable", "ok"]
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=0) as wal:
        async with wal.read(DeliverPolicy.all()) as scanner:
            with pytest.raises(walsvc.BackendUnavailable, match="injected: the read failed"):
                await _payloads(scanner, ack=False)
    assert plan == ["ok"]


async def test_a_read_that_ran_a_while_before_it_failed_again_goes_on(node: str) -> None:
    """``reconnect_timeout`` bounds a run of failures, not the stream's life: a resumed
    read that stood (here: waited longer than ``reconnect_timeout`` for its broker) before
    it failed again is read once more."""
    pchannel = f"p-{uuid.uuid4().hex[:10]}"
    await _appended(node, pchannel)
    plan = ["ok"] * 3 + ["timeout"] * 3
    _faulty.FaultyBackend.read_faults[pchannel] = plan
    async with await walsvc.open_wal(node, pchannel, reconnect_timeout=0.5) as wal:
        async with wal.read(DeliverPolicy.all()) as scanner:
            got = await _payloads(scanner, ack=False)
    assert got == list(range(COUNT))
    assert plan == []
