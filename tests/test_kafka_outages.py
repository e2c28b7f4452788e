"""The ``kafka://`` backend when the broker stalls, loses a topic or stops answering
(Tansu paused with SIGSTOP; see _tansu.py). Timeouts here only guard against hangs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _tansu import HANG, fresh, paused_broker, servers, tansu_url
from _tcp_proxy import TcpProxy
from aiokafka.admin import AIOKafkaAdminClient

import walsvc
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.backends._kafka import KafkaBackend
from walsvc.core._encode import encode

__all__ = ("paused_broker", "tansu_url")


@contextlib.asynccontextmanager
async def proxied_kafka(broker: tuple[str, int]) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A started proxy in front of ``broker`` and the ``kafka://`` URL through it. Only
    bootstrap connections pass it: the broker's metadata names its own address."""
    proxy = TcpProxy(broker)
    url = (await proxy.start()).replace("walsvc://", "kafka://")
    try:
        yield proxy, url
    finally:
        await proxy.aclose()


def data(label: str) -> Message:
    return Message(payload=label.encode(), vchannel="v")


def envelope(i: int) -> bytes:
    """A stored envelope of a small data message (the backend's own input)."""
    return encode(data(f"raw{i}"), timetick=1 + i, term=1)


async def read_back(url: str, pchannel: str, through: walsvc.MessageId) -> dict[str, list[Any]]:
    """Each INSERT's payload -> the ids a fresh reader delivers it at, through ``through``."""
    got: dict[str, list[Any]] = {}
    async with await walsvc.open_wal(url, pchannel, read_only=True) as reader:
        async with (
            asyncio.timeout(HANG),
            reader.read(DeliverPolicy.all(), raw=True, use_cache=False) as scanner,
        ):
            async for message in scanner:
                if message.type is MessageType.INSERT:
                    got.setdefault(message.payload.decode(), []).append(message.message_id)
                if message.message_id >= through:
                    return got
    raise AssertionError("scanner ended")


async def settle(calls: list[Any]) -> list[Any]:
    """The results of awaitables: an ``AppendResult`` or the exception raised."""
    return await asyncio.gather(*calls, return_exceptions=True)


async def test_an_append_is_acknowledged_only_with_its_own_records(paused_broker: Any) -> None:
    """Batch A's send and the resync after it time out while the broker is paused: A
    raises AppendOutcomeUnknown, and lands when the broker resumes. Batch B, appended
    meanwhile, must not be acknowledged with A's offsets (it was, when the failed resync
    was not redone before B and B's own resync took A's records for B's): every
    acknowledged append is delivered at the id it was acknowledged with."""
    url = paused_broker.url
    pchannel = fresh()
    wal = await walsvc.open_wal(url, pchannel, request_timeout=1.0, interceptors=[])
    try:
        acked: dict[str, walsvc.MessageId] = {}
        for i in range(3):
            acked[f"pre{i}"] = (await wal.append(data(f"pre{i}"))).message_id
        paused_broker.pause()
        first = await settle([wal.append(data(f"a{k}")) for k in range(8)])
        assert all(isinstance(r, walsvc.AppendOutcomeUnknown) for r in first), first
        second = [asyncio.ensure_future(wal.append(data(f"b{k}"))) for k in range(8)]
        await asyncio.sleep(1.5)  # B's send has timed out; (old code) its resync is running
        paused_broker.resume()
        async with asyncio.timeout(HANG):
            for k, result in enumerate(await settle(second)):
                assert isinstance(result, walsvc.AppendResult | walsvc.WALError), result
                if isinstance(result, walsvc.AppendResult):
                    acked[f"b{k}"] = result.message_id
            for k in range(8):
                acked[f"c{k}"] = (await wal.append(data(f"c{k}"))).message_id
    finally:
        paused_broker.resume()
        await wal.aclose()
    assert len(set(acked.values())) == len(acked), "an id was acknowledged twice"
    got = await read_back(url, pchannel, max(acked.values()))
    wrong = {label: (at, got.get(label)) for label, at in acked.items() if got.get(label) != [at]}
    assert not wrong, f"acknowledged but not delivered (once) at that id: {wrong}"


async def test_a_topic_deleted_under_the_writer_fails_its_appends(tansu_url: str) -> None:
    """The topic is deleted while the WAL is open (Tansu then creates it again, with
    several partitions, on the producer's next metadata request): no later append is
    acknowledged (the ids would repeat ids already given); each raises WALTruncated."""
    pchannel = fresh()
    async with await walsvc.open_wal(tansu_url, pchannel, request_timeout=5.0) as wal:
        before = [await wal.append(data(f"a{i}")) for i in range(5)]
        assert len({r.message_id for r in before}) == 5
        admin = AIOKafkaAdminClient(bootstrap_servers=servers(tansu_url))
        await admin.start()
        try:
            await admin.delete_topics([f"walsvc.{pchannel}"])
        finally:
            await admin.close()
        async with asyncio.timeout(HANG):
            after = await settle([wal.append(data(f"b{i}")) for i in range(10)])
            after += [await settle([wal.append(data(f"c{i}"))]) for i in range(10)]
        flat = [r for result in after for r in (result if isinstance(result, list) else [result])]
        assert all(isinstance(r, walsvc.WALTruncated) for r in flat), flat


async def test_closing_while_the_broker_does_not_answer(paused_broker: Any) -> None:
    """The broker stops answering with appends in flight and queued and a scanner open:
    the WAL's close returns (within the hang guard) and raises nothing (it let a
    CancelledError from aiokafka's consumer out), and every append gets a WALError."""
    wal = await walsvc.open_wal(paused_broker.url, fresh(), request_timeout=1.0)
    for i in range(10):
        await wal.append(data(f"a{i}"))
    backend = wal.backend
    assert isinstance(backend, KafkaBackend)
    await backend.reader.newest()  # the backend's own consumer exists and fetches
    scanner = wal.read(DeliverPolicy.all())
    async with asyncio.timeout(HANG):
        await anext(scanner)
    paused_broker.pause()
    pending = [asyncio.ensure_future(wal.append(data(f"q{i}"))) for i in range(20)]
    await asyncio.sleep(0.5)
    async with asyncio.timeout(HANG):
        await wal.aclose()
        results = await settle(pending)
    assert all(isinstance(r, walsvc.WALError) for r in results), results


async def test_a_close_is_bounded_by_close_timeout(paused_broker: Any) -> None:
    """With requests allowed 60 s, ``WAL.aclose`` ends after ``close_timeout``, well
    inside the 30 s hang guard (the WAL starts the backend's close before it drains its
    queued appends): the append in flight fails with AppendOutcomeUnknown, the queued
    ones with WALClosed, and nothing raises."""
    wal = await walsvc.open_wal(
        paused_broker.url, fresh(), request_timeout=60.0, close_timeout=0.5, interceptors=[]
    )
    await wal.append(data("first"))
    paused_broker.pause()
    in_flight = [asyncio.ensure_future(wal.append(data("sent")))]
    await asyncio.sleep(0.2)  # that batch is sent; these wait behind it
    queued = [asyncio.ensure_future(wal.append(data(f"q{i}"))) for i in range(3)]
    await asyncio.sleep(0)
    async with asyncio.timeout(HANG):
        await wal.aclose()
        outcomes = await settle(in_flight + queued)
    assert isinstance(outcomes[0], walsvc.AppendOutcomeUnknown), outcomes
    assert all(isinstance(r, walsvc.WALClosed) for r in outcomes[1:]), outcomes


async def test_opening_waits_for_a_paused_broker_until_connect_timeout(
    paused_broker: Any,
) -> None:
    """A broker paused when the WAL opens and resumed 2 s later: the open (each request
    allowed 1 s) keeps trying until connect_timeout and succeeds."""
    paused_broker.pause()
    opening = asyncio.ensure_future(
        walsvc.open_wal(paused_broker.url, fresh(), request_timeout=1.0, connect_timeout=20.0)
    )
    try:
        await asyncio.sleep(2.0)
        assert not opening.done(), opening
        paused_broker.resume()
        async with asyncio.timeout(HANG):
            wal = await opening
        async with wal:
            await wal.append(data("x"))
    finally:
        paused_broker.resume()
        if not opening.done():
            opening.cancel()
        with contextlib.suppress(BaseException):
            await opening


async def test_opening_a_paused_broker_names_the_bound(paused_broker: Any) -> None:
    paused_broker.pause()
    try:
        with pytest.raises(walsvc.BackendUnavailable, match=r"within 2\.0 s \(connect_timeout"):
            async with asyncio.timeout(HANG):
                await walsvc.open_wal(
                    paused_broker.url, fresh(), request_timeout=0.5, connect_timeout=2.0
                )
    finally:
        paused_broker.resume()


async def test_a_read_cancelled_while_its_fetcher_asks_for_metadata_leaves_no_connection(
    tansu_url: str,
) -> None:
    """aiokafka's bootstrap holds its first connection in a local variable while it asks
    for the cluster's metadata; a cancellation there left that connection open (found as
    an ``Unclosed AIOKafkaConnection`` a later test tripped over). A proxy in front of
    the broker answers the new connection's first request (ApiVersions) and holds the
    answer to the second (Metadata); the read is cancelled then."""
    host, _, port = servers(tansu_url).rpartition(":")
    async with proxied_kafka((host, int(port))) as (proxy, url):
        async with asyncio.timeout(HANG), await walsvc.open_wal(url, fresh()) as wal:
            first = (await wal.append(data("one"))).message_id
            proxy.hold_new_after("down", 1)
            scanner = wal.read(DeliverPolicy.start_from(first))
            read = asyncio.ensure_future(anext(scanner))
            await proxy.stalled.wait()
            (held,) = [pair for pair in proxy.open_pairs() if pair.hold_after is not None]
            await held.until_forwarded("up", 2)  # the Metadata request went up
            read.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await read
            await scanner.aclose()
            await held.closed.wait()  # the client closed its end
