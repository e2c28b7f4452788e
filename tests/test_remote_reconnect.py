"""Connection loss is not data loss: clients of a node (a subprocess) through a TCP
proxy that cuts, holds and refuses connections. Producers resend what was in flight
and every append lands exactly once; readers resume right after their last message;
only a node out of reach past ``reconnect_timeout`` fails what is pending. A
transaction's calls are resent too and land once (protocol version 2)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _chain_support import take, whole_log
from _node_process import node_process
from _tcp_proxy import TcpProxy

import walsvc
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.remote import _connection, _pending
from walsvc.remote._client import RemoteWAL


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with node_process(f"file://{tmp_path_factory.mktemp('node')}") as (node_url, _):
        yield node_url


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def _log(node: str, pchannel: str) -> list[walsvc.ImmutableMessage]:
    """Every message of ``pchannel``, read straight from the node (no proxy)."""
    async with await walsvc.open_wal(node, pchannel, read_only=True) as wal:
        latest = await wal.latest_message_id()
        found: list[walsvc.ImmutableMessage] = []
        if latest is None:
            return found
        async with asyncio.timeout(30), wal.read(DeliverPolicy.all(), timeticks=True) as scanner:
            async for message in scanner:
                if message.type != walsvc.MessageType.TIME_TICK:
                    found.append(message)
                if message.message_id == latest:
                    break
        return found


async def _drain(scanner: walsvc.Scanner) -> None:
    async with asyncio.timeout(10):
        async for _ in scanner:
            pass


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.01)


async def test_appends_whose_answers_were_lost_are_resent_and_land_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(url, pchannel) as wal:
        assert isinstance(wal, RemoteWAL)
        await wal.append(Message(payload=b"first", vchannel="v"))
        tcp.hold("down")  # the node gets the appends; their answers wait in the proxy
        one = asyncio.ensure_future(wal.append(Message(payload=b"one", vchannel="v")))
        many = asyncio.ensure_future(
            wal.append_many([Message(payload=b"m%d" % i, vchannel="v") for i in range(5)])
        )
        keyed = asyncio.ensure_future(
            wal.append(Message(payload=b"keyed", vchannel="v", idempotency_key="k1"))
        )
        async with asyncio.timeout(10):  # until they landed on the node
            while len(await _log(node, pchannel)) < 8:  # noqa: ASYNC110 (another process)
                await asyncio.sleep(0.02)
        assert not any(call.done() for call in (one, many, keyed))
        assert tcp.cut() == 1
        results = [await one, *(await many), await keyed]
        assert wal.connection.reconnects == 1
    payloads = [m.payload for m in await _log(node, pchannel)]
    # once each (the three calls ran concurrently: their order is the node's)
    assert sorted(payloads) == sorted([b"first", b"one", *(b"m%d" % i for i in range(5)), b"keyed"])
    found = {m.payload: m for m in await _log(node, pchannel)}
    assert [r.message_id for r in results] == [
        found[p].message_id for p in [b"one", *(b"m%d" % i for i in range(5)), b"keyed"]
    ]


async def test_producers_under_repeated_cuts_land_every_append_exactly_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    acknowledged: dict[bytes, walsvc.MessageId] = {}

    async def produce(wal: walsvc.WAL, producer: int) -> None:
        for i in range(60):
            payload = b"%d-%d" % (producer, i)
            result = await wal.append(Message(payload=payload, vchannel=f"v{producer % 4}"))
            acknowledged[payload] = result.message_id

    async def cut_now_and_then(done: asyncio.Event) -> int:
        cuts = 0
        while not done.is_set():
            await asyncio.sleep(0.05)
            cuts += tcp.cut()
        return cuts

    wals = [await walsvc.open_wal(url, pchannel) for _ in range(4)]
    done = asyncio.Event()
    cutter = asyncio.ensure_future(cut_now_and_then(done))
    try:
        await asyncio.gather(*(produce(wals[p % 4], p) for p in range(16)))
    finally:
        done.set()
        cuts = await cutter
        for wal in wals:
            await wal.aclose()
    assert cuts >= 2
    log = await _log(node, pchannel)
    payloads = [m.payload for m in log]
    assert len(payloads) == len(set(payloads)), "an append landed twice"
    assert set(payloads) == set(acknowledged)
    assert {m.payload: m.message_id for m in log} == acknowledged
    for producer in range(16):  # each producer's appends in its order
        mine = [p for p in payloads if p.startswith(b"%d-" % producer)]
        assert mine == [b"%d-%d" % (producer, i) for i in range(60)]
    assert all(m.idempotency_key is None for m in log)  # producer keys stay the node's


async def test_a_reader_resumes_after_its_last_message_without_gap_or_duplicate(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel) as writer,
        await walsvc.open_wal(url, pchannel, read_only=True, window_messages=16) as reader,
    ):
        scanner = reader.read(DeliverPolicy.all())
        expected = [b"%d" % i for i in range(400)]

        async def write() -> None:
            for chunk in range(0, 400, 20):
                await writer.append_many(
                    [Message(payload=p, vchannel="v") for p in expected[chunk : chunk + 20]]
                )
                await asyncio.sleep(0.005)

        got: list[bytes] = []
        writing = asyncio.ensure_future(write())
        async with asyncio.timeout(60):
            async for message in scanner:
                got.append(message.payload)
                if len(got) % 50 == 0:
                    tcp.cut()
                if len(got) == len(expected):
                    break
        await writing
        assert got == expected
        assert reader.connection.reconnects >= 5


async def test_a_latest_reader_that_received_nothing_sees_what_was_appended_while_cut_off(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel) as writer,
        await walsvc.open_wal(url, pchannel, read_only=True) as reader,
    ):
        await writer.append(Message(payload=b"before", vchannel="v"))
        scanner = reader.read(DeliverPolicy.latest())
        await _until(lambda: scanner._start_tick is not None)  # the node started it
        tcp.refusing = True
        tcp.cut()
        for i in range(3):
            await writer.append(Message(payload=b"during-%d" % i, vchannel="v"))
        tcp.refusing = False
        await writer.append(Message(payload=b"after", vchannel="v"))
        got = []
        async with asyncio.timeout(30):
            async for message in scanner:
                got.append(message.payload)
                if len(got) == 4:
                    break
        assert got == [b"during-0", b"during-1", b"during-2", b"after"]


async def test_a_half_open_link_is_found_by_the_heartbeat_and_redialled(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    async with await walsvc.open_wal(url, _pchannel(), heartbeat=0.2) as wal:
        assert isinstance(wal, RemoteWAL)
        await wal.append(Message(payload=b"a", vchannel="v"))
        tcp.hold("up", "down")  # nothing passes, nothing closes
        async with asyncio.timeout(10):
            result = await wal.append(Message(payload=b"b", vchannel="v"))
        assert result.message_id is not None
        assert wal.connection.reconnects == 1


async def test_a_node_out_of_reach_past_the_timeout_fails_what_is_pending(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    """Past ``reconnect_timeout`` what was pending fails, and so does a call made while
    the node stays away; once it is back, the next call dials again and the same WAL
    appends and reads (before: every later call raised the "retriable"
    ``BackendUnavailable`` for good)."""
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(url, pchannel, reconnect_timeout=0.5) as wal:
        assert isinstance(wal, RemoteWAL)
        reader = wal.read(DeliverPolicy.all())
        await wal.append(Message(payload=b"a", vchannel="v"))
        tcp.hold("down")
        pending = asyncio.ensure_future(wal.append(Message(payload=b"b", vchannel="v")))
        await asyncio.sleep(0.3)
        tcp.refusing = True
        tcp.cut()
        with pytest.raises(walsvc.AppendOutcomeUnknown, match="could not be reconnected"):
            await pending
        with pytest.raises(walsvc.BackendUnavailable):
            await _drain(reader)
        with pytest.raises(walsvc.BackendUnavailable):
            await wal.append(Message(payload=b"c", vchannel="v"))
        tcp.refusing = False  # the node is back
        async with asyncio.timeout(10):
            last = await wal.append(Message(payload=b"d", vchannel="v"))
            async with wal.read(DeliverPolicy.all()) as again:
                payloads = []
                async for message in again:
                    payloads.append(message.payload)
                    if message.message_id == last.message_id:
                        break
        assert wal.connection.reconnects == 1
    assert payloads == [b"a", b"b", b"d"]  # b reached the node; its answer did not


async def test_without_reconnection_a_lost_connection_fails_at_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    async with await walsvc.open_wal(url, _pchannel(), reconnect_timeout=0) as wal:
        await wal.append(Message(payload=b"a", vchannel="v"))
        tcp.hold("down")
        pending = asyncio.ensure_future(wal.append(Message(payload=b"b", vchannel="v")))
        await asyncio.sleep(0.2)
        tcp.cut()
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await pending


async def test_a_user_key_with_the_producer_prefix_is_refused(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        with pytest.raises(walsvc.InvalidMessage, match="producer keys"):
            await wal.append(Message(payload=b"a", vchannel="v", idempotency_key="~mine"))


async def _replace_the_node_under_load(
    tmp_path: Path,
    producers: int,
    each: int,
    stop: Callable[[TcpProxy, subprocess.Popen[str]], Awaitable[None]],
) -> tuple[list[walsvc.WAL], dict[bytes, walsvc.MessageId]]:
    """``producers`` producers (over 8 connections) append ``each`` messages and a
    consumer reads, all through a proxy, to a node over a file:// log; once 600 appends
    were acknowledged ``stop`` ends the node, and a new one on the same log takes over
    behind the proxy. Checks that every acknowledged append reached the consumer once,
    each producer's in order, and that the log holds exactly those, at their ids."""
    log_url = f"file://{tmp_path}"
    pchannel = _pchannel()
    acknowledged: dict[bytes, walsvc.MessageId] = {}
    with node_process(log_url) as (first_url, first):
        tcp = TcpProxy.for_url(first_url)
        url = await tcp.start()
        wals = [await walsvc.open_wal(url, pchannel) for _ in range(8)]
        reader = await walsvc.open_wal(url, pchannel, read_only=True)
        seen: list[bytes] = []

        async def consume() -> None:
            async for message in reader.read(DeliverPolicy.all()):
                seen.append(message.payload)  # noqa: PERF401 (seen is watched while it grows)

        async def produce(producer: int) -> None:
            wal = wals[producer % 8]
            for i in range(each):
                payload = b"%d-%d" % (producer, i)
                result = await wal.append(Message(payload=payload, vchannel=f"v{producer % 4}"))
                acknowledged[payload] = result.message_id

        consumer = asyncio.ensure_future(consume())
        running = asyncio.ensure_future(asyncio.gather(*(produce(p) for p in range(producers))))
        async with asyncio.timeout(30):
            while len(acknowledged) < 600:  # noqa: ASYNC110 (no event to wait on)
                await asyncio.sleep(0.005)
        await stop(tcp, first)
        with node_process(log_url) as (second_url, _):
            tcp.retarget(second_url)
            tcp.refusing = False
            async with asyncio.timeout(120):
                await running  # raises if any append failed
                while len(seen) < len(acknowledged):  # noqa: ASYNC110 (no event to wait on)
                    await asyncio.sleep(0.01)
            consumer.cancel()
            for wal in [*wals, reader]:
                await wal.aclose()
            await tcp.aclose()
            log = await _log(second_url, pchannel)
    assert len(acknowledged) == producers * each
    assert len(seen) == len(set(seen)), "the consumer got a message twice"
    assert set(seen) == set(acknowledged)
    for producer in range(producers):
        mine = [p for p in seen if p.startswith(b"%d-" % producer)]
        assert mine == [b"%d-%d" % (producer, i) for i in range(each)]
    assert [m.payload for m in log] == seen
    assert {m.payload: m.message_id for m in log} == acknowledged
    return wals, acknowledged


async def test_a_node_killed_and_restarted_under_64_producers_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """kill -9 of a node over file:// while 64 producers append and a consumer reads;
    the appends in flight (their answers held back, so they landed unanswered) are
    resent to the new node and land once (its dedup window is rebuilt from the log)."""

    async def kill(tcp: TcpProxy, node: subprocess.Popen[str]) -> None:
        tcp.hold("down")  # appends still land; their answers die with the node
        await asyncio.sleep(0.2)
        node.kill()
        node.wait()
        tcp.cut()  # the dead node's sockets are closed (the held ones too)

    wals, _ = await _replace_the_node_under_load(tmp_path, 64, 40, kill)
    assert all(wal.connection.reconnects >= 1 for wal in wals)


async def test_producers_and_a_reader_ride_through_a_drained_and_replaced_node(
    tmp_path: Path,
) -> None:
    """SIGTERM drains the node (clients hear GoingAway, hold new requests, and resend
    what the draining node refused on the next socket); no call fails."""

    async def drain(tcp: TcpProxy, node: subprocess.Popen[str]) -> None:
        tcp.refusing = True  # the next node is not up yet
        node.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(node.wait, 30) == 0

    wals, _ = await _replace_the_node_under_load(tmp_path, 16, 60, drain)
    assert any(wal.connection.reconnects for wal in wals)


async def test_a_caller_firing_appends_without_awaiting_waits_for_room(
    node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pending, "MAX_PENDING", 8)
    waiting: list[int] = []
    request = _connection.Connection.request

    def counting(conn: _connection.Connection, *args: Any, **kwargs: Any) -> Any:
        pending = request(conn, *args, **kwargs)
        waiting.append(len(conn._pending))
        return pending

    monkeypatch.setattr(_connection.Connection, "request", counting)
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        calls = [wal.append(Message(payload=b"%d" % i, vchannel="v")) for i in range(200)]
        results = await asyncio.gather(*calls)
        assert len({r.message_id for r in results}) == 200
        assert max(waiting) <= 8


async def test_a_resumed_reader_sees_a_transaction_that_was_open_at_its_last_message(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    """A transaction begun before the reader's last message and committed while the
    reader was cut off is delivered after the resume: its begin and body precede that
    message in the log, so a stream resumed just after the message's id (not from its
    checkpoint) would never see them and would drop the TXN (seen first by the seeded
    fault schedule with transactions)."""
    tcp, url = proxy
    pchannel = _pchannel()
    async with (
        await walsvc.open_wal(node, pchannel) as writer,
        await walsvc.open_wal(url, pchannel, read_only=True) as reader,
    ):
        scanner = reader.read(DeliverPolicy.all())
        txn = await writer.begin_txn("v")
        await txn.append(Message(payload=b"body", vchannel="v"))
        before = await writer.append(Message(payload=b"before", vchannel="v"))
        assert [m.message_id for m in await take(scanner, 1)] == [before.message_id]
        tcp.refusing = True  # the reader cannot resume until both are in the log
        assert tcp.cut() == 1
        commit = await txn.commit()
        after = await writer.append(Message(payload=b"after", vchannel="v"))
        tcp.refusing = False
        (first,) = await take(scanner, 1)
        assert (first.type, first.message_id) == (MessageType.TXN, commit.message_id), first
        assert [m.payload for m in first.body] == [b"body"]
        assert [m.message_id for m in await take(scanner, 1)] == [after.message_id]
        await scanner.aclose()
        assert reader.connection.reconnects == 1


async def _stored(node: str, pchannel: str) -> list[walsvc.ImmutableMessage]:
    """What ``pchannel`` stores but TimeTicks (a transaction's parts one by one)."""
    return [m for m in await whole_log(node, pchannel) if m.type is not MessageType.TIME_TICK]


async def _lose_the_answer(
    tcp: TcpProxy, node: str, pchannel: str, call: Any, stored: int
) -> asyncio.Future[Any]:
    """Start ``call`` with its answer held in the proxy; once the node stored ``stored``
    messages in all, cut the connection; return the call."""
    tcp.hold("down")
    started = asyncio.ensure_future(call)
    async with asyncio.timeout(10):
        while len(await _stored(node, pchannel)) < stored:  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.02)
    assert not started.done()
    assert tcp.cut() == 1
    return started


async def test_a_transaction_whose_answers_were_lost_lands_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(url, pchannel) as wal:
        txn = await (await _lose_the_answer(tcp, node, pchannel, wal.begin_txn("v"), 1))
        bodies = [Message(payload=b"b%d" % i, vchannel="v") for i in range(4)]
        one = await _lose_the_answer(tcp, node, pchannel, txn.append(bodies[0]), 2)
        assert (await one).message_id is not None
        many = await _lose_the_answer(tcp, node, pchannel, txn.append_many(bodies[1:]), 5)
        assert len(await many) == 3
        commit = await (await _lose_the_answer(tcp, node, pchannel, txn.commit(), 6))
        assert wal.connection.reconnects == 4
    stored = await _stored(node, pchannel)
    assert [m.type for m in stored] == [
        MessageType.BEGIN_TXN,
        *[MessageType.INSERT] * 4,
        MessageType.COMMIT_TXN,
    ]
    assert [m.payload for m in stored[1:5]] == [b.payload for b in bodies]
    assert stored[-1].message_id == commit.message_id
    assert {m.txn.txn_id for m in stored if m.txn is not None} == {txn.txn_id}


async def test_a_rollback_whose_answer_was_lost_is_answered_once(
    node: str, proxy: tuple[TcpProxy, str]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(url, pchannel) as wal:
        txn = await wal.begin_txn("v")
        await txn.append(Message(payload=b"gone", vchannel="v"))
        await (await _lose_the_answer(tcp, node, pchannel, txn.rollback(), 3))
    stored = await _stored(node, pchannel)
    assert [m.type for m in stored] == [
        MessageType.BEGIN_TXN,
        MessageType.INSERT,
        MessageType.ROLLBACK_TXN,
    ]


@pytest.mark.parametrize(
    "options",
    [{"versions": (1, 1)}, {"exactly_once": False}],
    ids=["version-1", "exactly-once-off"],
)
async def test_a_lost_transaction_answer_is_unknown_without_resends(
    node: str, proxy: tuple[TcpProxy, str], options: dict[str, Any]
) -> None:
    tcp, url = proxy
    pchannel = _pchannel()
    async with await walsvc.open_wal(url, pchannel, **options) as wal:
        txn = await wal.begin_txn("v")
        body = txn.append(Message(payload=b"x", vchannel="v"))
        lost = await _lose_the_answer(tcp, node, pchannel, body, 2)
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await lost
