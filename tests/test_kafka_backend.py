"""The ``kafka://`` backend against a real Kafka-protocol broker (Tansu, see _tansu.py).

Known Tansu deviations are strict xfails naming them; see also ``walsvc.backends._kafka``
(high watermark, auto-created topics) for the ones the backend works around.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from _tansu import (
    HANG,
    fresh,
    paused_broker,
    raw_copy,
    servers,
    start_tansu,
    take_inserts,
    tansu_url,
)
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import walsvc
from walsvc import DeliverPolicy, Message, MessageType, WALFenced
from walsvc.backends._kafka import KafkaMessageId
from walsvc.testing import check_backend, check_truncation

Opener = Callable[..., Awaitable[walsvc.WAL]]

TRUNCATION_DEVIATION = (
    "Tansu 0.6 does not implement DeleteRecords (its worker panics 'not yet implemented'"
    " and closes the connection), so truncate cannot be shown on it"
)

# Fixtures imported from the helper module (pytest finds them by name here).
__all__ = ("paused_broker", "tansu_url")


def opener(url: str, **options: Any) -> Opener:
    def open_wal_for(pchannel: str, *, read_only: bool) -> Awaitable[walsvc.WAL]:
        return walsvc.open_wal(url, pchannel, read_only=read_only, **options)

    return open_wal_for


async def read_inserts(
    wal: walsvc.WAL, deliver: DeliverPolicy, until: walsvc.MessageId
) -> list[walsvc.ImmutableMessage]:
    """The INSERT messages the backend delivers from ``deliver`` through id ``until``."""
    out: list[walsvc.ImmutableMessage] = []
    async with asyncio.timeout(HANG), wal.read(deliver, raw=True, use_cache=False) as scanner:
        async for message in scanner:
            if message.type is MessageType.INSERT:
                out.append(message)
            if message.message_id >= until:
                return out
    raise AssertionError("scanner ended")


# -- conformance ------------------------------------------------------------------------


async def test_conformance(tansu_url: str) -> None:
    """The whole battery, durable subscriptions included (truncation: see below)."""
    await check_backend(opener(tansu_url), message_count=100, pchannels=2, truncation=False)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=TRUNCATION_DEVIATION)
async def test_truncation() -> None:
    broker = start_tansu()  # DeleteRecords breaks the broker's connection: a broker of its own
    try:
        await check_truncation(opener(broker.url), hang_after=HANG)
    finally:
        broker.stop()


async def test_truncate_refused_by_the_broker_is_a_typed_error() -> None:
    broker = start_tansu()
    try:
        async with await walsvc.open_wal(broker.url, fresh(), request_timeout=5) as wal:
            sent = await wal.append(Message(payload=b"x", vchannel="v"))
            with pytest.raises(walsvc.BackendUnavailable, match="DeleteRecords"):
                async with asyncio.timeout(HANG):
                    await wal.truncate(sent.message_id)
            # the mark written before the attempt keeps the newest id and tick readable
            assert await wal.latest_message_id() is not None
    finally:
        broker.stop()


# -- opening and options ----------------------------------------------------------------


async def test_unreachable_broker_is_backend_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens
    with pytest.raises(walsvc.BackendUnavailable, match="cannot reach Kafka"):
        async with asyncio.timeout(HANG):
            await walsvc.open_wal(f"kafka://127.0.0.1:{port}", "p", connect_timeout=0.5)


async def test_silent_broker_is_backend_unavailable_after_connect_timeout() -> None:
    """A port that accepts connections and never answers: the open gives up after
    connect_timeout with BackendUnavailable instead of hanging."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        port = sock.getsockname()[1]
        with pytest.raises(walsvc.BackendUnavailable, match=r"within 0\.5 s"):
            async with asyncio.timeout(HANG):
                await walsvc.open_wal(f"kafka://127.0.0.1:{port}", "p", connect_timeout=0.5)


async def test_topic_with_two_partitions_is_refused(tansu_url: str) -> None:
    pchannel = fresh()
    admin = AIOKafkaAdminClient(bootstrap_servers=servers(tansu_url))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(f"walsvc.{pchannel}", 2, 1)])
    finally:
        await admin.close()
    for read_only in (False, True):
        with pytest.raises(walsvc.InvalidArgument, match="has 2 partitions"):
            await walsvc.open_wal(tansu_url, pchannel, read_only=read_only)


async def test_read_only_open_of_a_missing_pchannel(tansu_url: str) -> None:
    with pytest.raises(walsvc.InvalidArgument, match="no kafka WAL"):
        await walsvc.open_wal(tansu_url, fresh(), read_only=True)


@pytest.mark.parametrize(
    ("url_tail", "options", "error", "match"),
    [
        ("", {"no_such_option": 1}, TypeError, "unknown option"),
        ("", {"connect_timeout": 0}, walsvc.InvalidArgument, "connect_timeout"),
        ("", {"request_timeout": "5"}, walsvc.InvalidArgument, "request_timeout"),
        ("", {"max_batch_bytes": 10}, walsvc.InvalidArgument, "max_batch_bytes"),
        ("", {"max_batch_bytes": True}, walsvc.InvalidArgument, "max_batch_bytes"),
        ("", {"topic_prefix": "a/b"}, walsvc.InvalidArgument, "topic_prefix"),
        ("/path", {}, walsvc.InvalidArgument, "host:port"),
    ],
)
async def test_bad_options_and_urls(
    tansu_url: str, url_tail: str, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await walsvc.open_wal(tansu_url + url_tail, fresh(), **options)


async def test_no_port_in_url() -> None:
    with pytest.raises(walsvc.InvalidArgument, match="host:port"):
        await walsvc.open_wal("kafka://localhost", "p")


async def test_topic_prefix_and_oversized_messages(tansu_url: str) -> None:
    pchannel = fresh()
    async with await walsvc.open_wal(
        tansu_url, pchannel, topic_prefix="other-", max_message_size=1000
    ) as wal:
        with pytest.raises(walsvc.MessageTooLarge):
            await wal.append(Message(payload=bytes(2000), vchannel="v"))
        sent = await wal.append(Message(payload=bytes(500), vchannel="v"))
    admin = AIOKafkaAdminClient(bootstrap_servers=servers(tansu_url))
    await admin.start()
    try:
        assert f"other-{pchannel}" in await admin.list_topics()
    finally:
        await admin.close()
    async with await walsvc.open_wal(
        tansu_url, pchannel, topic_prefix="other-", read_only=True
    ) as reader:
        latest = await reader.latest_message_id()
        assert latest is not None
        assert latest >= sent.message_id  # TimeTicks may follow
        (got,) = await read_inserts(reader, DeliverPolicy.all(), sent.message_id)
        assert got.payload == bytes(500)


async def test_the_topic_holds_the_wals_max_message_size_and_one_call_is_bounded(
    tansu_url: str,
) -> None:
    """The topic and producer are sized from the WAL's max_message_size (here above the
    5 MiB default and the 1 MiB batch limit); one append call is never split, so a call
    larger than that raises MessageTooLarge before anything is sent."""
    pchannel = f"big-{uuid.uuid4().hex[:8]}"
    seven_mib = bytes(7 << 20)
    async with await walsvc.open_wal(tansu_url, pchannel, max_message_size=8 << 20) as wal:
        big = await wal.append(Message(payload=seven_mib, vchannel="v"))
        too_many = [Message(payload=bytes(1 << 20), vchannel="v") for _ in range(9)]
        with pytest.raises(walsvc.MessageTooLarge, match="split the append_many call"):
            await wal.append_many(too_many)
        after = await wal.append(Message(payload=b"after", vchannel="v"))
    async with await walsvc.open_wal(tansu_url, pchannel, read_only=True) as reader:
        got = await read_inserts(reader, DeliverPolicy.start_from(big.message_id), after.message_id)
    assert [len(m.payload) for m in got] == [len(seven_mib), len(b"after")]


async def test_a_log_of_barriers_only_is_empty(tansu_url: str) -> None:
    """Barriers are not messages: a pchannel opened twice without appends has no latest
    id and timetick 0, and a reader from ``all`` sees nothing."""
    pchannel = fresh()
    async with await walsvc.open_wal(tansu_url, pchannel, interceptors=[]):
        pass
    async with await walsvc.open_wal(tansu_url, pchannel, interceptors=[]) as wal:
        assert await wal.latest_message_id() is None
        assert await wal._backend.last_timetick() == 0
        sent = await wal.append(Message(payload=b"one", vchannel="v"))
        assert await wal.latest_message_id() == sent.message_id
        assert await wal._backend.last_timetick() == sent.timetick
        assert [
            m.payload for m in await read_inserts(wal, DeliverPolicy.all(), sent.message_id)
        ] == [b"one"]


async def test_ids_marshal_round_trip() -> None:
    assert walsvc.unmarshal_message_id(KafkaMessageId(42).marshal()) == KafkaMessageId(42)
    assert KafkaMessageId(42).marshal() == "kafka:42"


# -- the offset chain -------------------------------------------------------------------


async def test_stragglers_of_an_older_writer_are_dropped_and_the_batch_resent(
    tansu_url: str,
) -> None:
    """A record of an older writer that lands after the new writer's barrier (a zombie's
    straggler) is invalid: no reader delivers it, and the new writer's batch that it
    displaced is sent again and acknowledged."""
    pchannel = fresh()
    async with await walsvc.open_wal(tansu_url, pchannel, interceptors=[]) as wal:
        first = await wal.append(Message(payload=b"first", vchannel="v"))
        async with await walsvc.open_wal(tansu_url, pchannel, interceptors=[]) as new:
            straggler = await raw_copy(tansu_url, pchannel, first.message_id)
            assert straggler > first.message_id.seq
            sent = await new.append(Message(payload=b"second", vchannel="v"))
            assert sent.message_id.seq > straggler
            got = await read_inserts(new, DeliverPolicy.all(), sent.message_id)
            assert [m.payload for m in got] == [b"first", b"second"]
            with pytest.raises(WALFenced):
                await wal.append(Message(payload=b"late", vchannel="v"))
            got = await read_inserts(new, DeliverPolicy.all(), sent.message_id)
            assert [m.payload for m in got] == [b"first", b"second"]


async def test_foreign_record_is_corrupt(tansu_url: str) -> None:
    pchannel = fresh()
    async with await walsvc.open_wal(tansu_url, pchannel, interceptors=[]) as wal:
        await wal.append(Message(payload=b"ok", vchannel="v"))
        producer = AIOKafkaProducer(bootstrap_servers=servers(tansu_url), acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(f"walsvc.{pchannel}", b"not walsvc", partition=0)
        finally:
            await producer.stop()
        with pytest.raises(walsvc.CorruptRecord, match="not a walsvc record"):
            await read_inserts(wal, DeliverPolicy.all(), KafkaMessageId(10**9))


@pytest.mark.parametrize("old_producers", [1, 4])
async def test_takeover_race(tansu_url: str, old_producers: int) -> None:
    """The old writer appends concurrently while the new one opens: every append acked
    to either writer is read back (from all and from the middle), no append that raised
    WALFenced is, and the new writer is never fenced."""
    pchannel = fresh()
    old = await walsvc.open_wal(tansu_url, pchannel)
    acked: list[walsvc.AppendResult] = []
    refused: set[bytes] = set()
    started = asyncio.Event()

    async def produce(k: int) -> None:
        for i in range(10_000):
            payload = b"old-%d-%d" % (k, i)
            try:
                acked.append(await old.append(Message(payload=payload, vchannel="v")))
            except WALFenced:
                refused.add(payload)
                return
            if len(acked) >= 20:
                started.set()

    try:
        async with asyncio.timeout(HANG):
            tasks = [asyncio.create_task(produce(k)) for k in range(old_producers)]
            await started.wait()
            async with await walsvc.open_wal(tansu_url, pchannel) as new:
                assert new.term > old.term
                new_acked = [
                    await new.append(Message(payload=b"new-%d" % i, vchannel="v"))
                    for i in range(20)
                ]
                await asyncio.gather(*tasks)
                assert refused, "the old writer was never fenced"
                last = new_acked[-1].message_id
                expected = sorted(acked + new_acked, key=lambda r: r.message_id)
                async with await walsvc.open_wal(tansu_url, pchannel, read_only=True) as reader:
                    got = await read_inserts(reader, DeliverPolicy.all(), last)
                    assert [m.message_id for m in got] == [r.message_id for r in expected]
                    assert not refused & {m.payload for m in got}
                    middle = expected[len(expected) // 2].message_id
                    got = await read_inserts(reader, DeliverPolicy.start_from(middle), last)
                    assert [m.message_id for m in got] == [
                        r.message_id for r in expected if r.message_id >= middle
                    ]
                    got = await read_inserts(reader, DeliverPolicy.start_after(middle), last)
                    assert [m.message_id for m in got] == [
                        r.message_id for r in expected if r.message_id > middle
                    ]
    finally:
        await old.aclose()


# -- outages ------------------------------------------------------------------------------


@pytest.mark.parametrize("request_timeout", [10.0, 0.5])
async def test_broker_paused_mid_stream(paused_broker: Any, request_timeout: float) -> None:
    """The broker freezes (SIGSTOP) while keyed appends are in flight. Each caller retries
    its append (same idempotency key) on a retriable error or an unknown outcome until its
    deadline: every append ends acknowledged, none twice, none lost; a reader that
    checkpointed before the outage resumes after it with no gap and no duplicate.

    With a request timeout longer than the pause the appends just wait; with a shorter
    one the backend's sends time out during the pause and are settled by a resync (the
    WAL's redo and dedup interceptors, or the caller, retry what failed)."""
    url = paused_broker.url
    pchannel = fresh()
    wal = await walsvc.open_wal(url, pchannel, request_timeout=request_timeout)
    try:

        def message(i: int) -> Message:
            return Message(
                payload=b"m%d" % i, vchannel="v", idempotency_key=walsvc.producer_key("p", i)
            )

        before = [await wal.append(message(i)) for i in range(10)]
        async with wal.read(DeliverPolicy.all()) as scanner:
            async with asyncio.timeout(HANG):
                seen = [m async for m in take_inserts(scanner, 5)]
        checkpoint = seen[-1].checkpoint

        errors: list[str] = []

        async def append_until_done(i: int) -> walsvc.AppendResult:
            async with asyncio.timeout(HANG):  # the caller's deadline
                while True:
                    try:
                        return await wal.append(message(i))
                    except (walsvc.BackendUnavailable, walsvc.AppendOutcomeUnknown) as exc:
                        errors.append(type(exc).__name__)
                        await asyncio.sleep(0.1)

        paused_broker.pause()
        tasks = [asyncio.create_task(append_until_done(i)) for i in range(10, 30)]
        await asyncio.sleep(request_timeout * 2 if request_timeout < 1 else 1.0)
        paused_broker.resume()
        during = await asyncio.gather(*tasks)
        again = [await wal.append(message(i)) for i in (12, 25)]  # retries after the fact
        assert again == [during[2], during[15]]
        acked = before + during
        assert len({r.message_id for r in acked}) == 30

        last = max(r.message_id for r in acked)
        async with await walsvc.open_wal(url, pchannel, read_only=True) as reader:
            everything = await read_inserts(reader, DeliverPolicy.all(), last)
            assert sorted(m.payload for m in everything) == sorted(b"m%d" % i for i in range(30))
            async with reader.read(DeliverPolicy.from_checkpoint(checkpoint)) as resumed:
                async with asyncio.timeout(HANG):
                    rest = [m async for m in take_inserts(resumed, 25)]
        assert [m.payload for m in seen + rest] == [m.payload for m in everything]
    finally:
        await wal.aclose()


async def test_closing_a_scanner_ends_its_pending_read_at_once(tansu_url: str) -> None:
    """A backend scanner waiting at the tail (its fetch in flight, long-polling the
    broker) raises WALClosed as soon as it is closed, and leaves no fetch behind."""
    async with await walsvc.open_wal(tansu_url, fresh(), interceptors=[]) as wal:
        await wal.append(Message(payload=b"x", vchannel="v"))
        backend = wal.backend
        scanner = backend.read(DeliverPolicy.all(), walsvc.Filter())
        assert len(await scanner.next_batch()) == 1
        waiting = asyncio.create_task(scanner.next_batch())
        await asyncio.sleep(0.3)  # past the first long poll: a later fetch is in flight
        assert not waiting.done()
        async with asyncio.timeout(2):
            await scanner.aclose()
            with pytest.raises(walsvc.WALClosed):
                await waiting
