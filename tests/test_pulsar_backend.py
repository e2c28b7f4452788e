"""The ``pulsar://`` backend against a real Pulsar-protocol broker (Pulsar Lite)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import pulsar
import pulsar.asyncio as pulsar_asyncio
import pytest
from _pulsar_lite import (
    HANG,
    PulsarLite,
    backend_of,
    broker,
    client_logger,
    data,
    in_plain_client,
    own_broker,
    pchannel,
    raw_payloads,
    read_labels,
    take_data,
)
from pulsar import _pulsar

import walsvc
import walsvc.backends._pulsar._backend as pulsar_backend
import walsvc.backends._pulsar._log
import walsvc.backends._pulsar._writer
from walsvc import DeliverPolicy, Filter, Message
from walsvc.backends import BackendScanner
from walsvc.backends._pulsar import PulsarMessageId
from walsvc.testing import check_backend

Opener = Callable[..., Awaitable[walsvc.WAL]]

# Fixtures imported from the helper module (pytest finds them by name here).
__all__ = ("broker", "own_broker")


def opener(url: str, **options: Any) -> Opener:
    def open_wal_for(pchannel: str, *, read_only: bool) -> Awaitable[walsvc.WAL]:
        return walsvc.open_wal(url, pchannel, read_only=read_only, **options)

    return open_wal_for


async def test_conformance(broker: PulsarLite) -> None:
    """The whole battery, durable subscriptions included (truncation is refused: see
    ``test_truncation_step``)."""
    await check_backend(opener(broker.url), message_count=100, pchannels=2, truncation=False)


# ---------------------------------------------------------------------------------------
# Ids and options


def test_message_id_order_marshal_and_registry() -> None:
    ids = [
        PulsarMessageId(0, 1, -1),
        PulsarMessageId(0, 2, 0),
        PulsarMessageId(0, 2, 1),
        PulsarMessageId(1, 0, 0),
    ]
    assert sorted(reversed(ids)) == ids
    assert len({*ids, PulsarMessageId(0, 2, 0)}) == 4
    for message_id in ids:
        assert walsvc.unmarshal_message_id(message_id.marshal()) == message_id
    for bad in ("pulsar:1:2", "pulsar:a:1:2:3", "pulsar:1:2:-5:-1", "pulsar:-1:0:0:-1"):
        with pytest.raises(walsvc.CorruptRecord):
            walsvc.unmarshal_message_id(bad)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"no_such_option": 1}, TypeError),
        ({"connect_timeout": 0}, walsvc.InvalidArgument),
        ({"connect_timeout": "1"}, walsvc.InvalidArgument),
        ({"operation_timeout": float("nan")}, walsvc.InvalidArgument),
        ({"batching_max_messages": 0}, walsvc.InvalidArgument),
        ({"batching_max_publish_delay_ms": -1}, walsvc.InvalidArgument),
        ({"batching_max_messages": True}, walsvc.InvalidArgument),
        ({"topic_prefix": "walsvc."}, walsvc.InvalidArgument),
    ],
)
async def test_bad_options(
    broker: PulsarLite, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        await walsvc.open_wal(broker.url, pchannel(), **options)


async def test_bad_url() -> None:
    with pytest.raises(walsvc.InvalidArgument):
        await walsvc.open_wal("pulsar://no-port", "p")


async def test_unreachable_broker_is_unavailable_within_connect_timeout() -> None:
    with socket_closed_port() as port:
        async with asyncio.timeout(HANG):
            with pytest.raises(walsvc.BackendUnavailable):
                await walsvc.open_wal(f"pulsar://127.0.0.1:{port}", "p", connect_timeout=0.5)
            with pytest.raises(walsvc.BackendUnavailable):
                await walsvc.open_wal(
                    f"pulsar://127.0.0.1:{port}", "p", read_only=True, connect_timeout=0.5
                )


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, not listening, for the test's life)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_topic_prefix_and_truncate_refused(broker: PulsarLite) -> None:
    pch = pchannel()
    prefix = "persistent://public/default/other-prefix."
    async with await walsvc.open_wal(broker.url, pch, topic_prefix=prefix) as wal:
        result = await wal.append(data("a", 0))
        assert backend_of(wal).topic == prefix + pch
        with pytest.raises(walsvc.InvalidArgument, match="cannot truncate"):
            await wal.truncate(result.message_id)
    # The default prefix names another topic: nothing there.
    assert await read_labels(broker.url, pch, DeliverPolicy.all(), 0) == []
    assert await read_labels(broker.url, pch.join(["", ""]), DeliverPolicy.all(), 0) == []


@pytest.mark.xfail(
    strict=True,
    reason="Pulsar Lite deviation: truncation needs the admin API (retention), which"
    " pulsar-client does not offer and Pulsar Lite does not serve",
)
async def test_truncation_step(broker: PulsarLite) -> None:
    from walsvc.testing import check_truncation

    await check_truncation(opener(broker.url))


@pytest.mark.xfail(
    strict=True,
    reason="Pulsar Lite deviation: a reader at MessageId.latest with"
    " start_message_id_inclusive=True does not deliver the topic's last message",
)
async def test_reader_at_latest_inclusive_gets_the_last_message(broker: PulsarLite) -> None:
    def check(client: pulsar.Client) -> None:
        topic = f"persistent://public/default/latest-{uuid.uuid4().hex}"
        client.create_producer(topic).send(b"last")
        reader = client.create_reader(
            topic, pulsar.MessageId.latest, start_message_id_inclusive=True
        )
        # loopback: Apache Pulsar answers at once
        assert reader.read_next(timeout_millis=1000).data() == b"last"

    await in_plain_client(broker.url, check)


class _RedeliveringReader:
    """A stand-in for a ``Reader`` (``walsvc.backends._pulsar._calls``) whose C reader
    delivers entries again, as Pulsar Lite was seen to do now and then (a fault the real
    broker produces only intermittently, so it is replayed here)."""

    def __init__(self, ids: list[tuple[int, int, int]]) -> None:
        self._reader = _QueuedCReader(ids)

    def topic(self) -> str:
        return "fake"


class _QueuedCReader:
    """The C reader's synchronous ``read_next(timeout_ms)`` over a fixed list of ids."""

    def __init__(self, ids: list[tuple[int, int, int]]) -> None:
        self._ids = list(ids)

    def read_next(self, timeout_ms: int) -> Any:
        if not self._ids:
            raise pulsar.Timeout()
        ledger, entry, batch = self._ids.pop(0)
        return _FakeMessage(pulsar.MessageId(-1, ledger, entry, batch))


class _FakeMessage:
    def __init__(self, message_id: pulsar.MessageId) -> None:
        self._id = message_id

    def message_id(self) -> pulsar.MessageId:
        return self._id

    def properties(self) -> dict[str, str]:
        return {"walsvc.barrier": "1"}

    def data(self) -> bytes:
        return b""


async def test_redelivered_messages_are_dropped() -> None:
    from walsvc.backends._pulsar import _log, _reader

    delivered = [(0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0)]
    reader = _reader.OrderedReader(cast(Any, _RedeliveringReader(delivered)))
    dropped = _reader.redeliveries_dropped
    got = [link.id for link in await _log.read_links(reader)]
    assert got == [
        PulsarMessageId(0, 1, 0),
        PulsarMessageId(0, 1, 1),
        PulsarMessageId(0, 1, 2),
        PulsarMessageId(0, 2, 0),
    ]
    assert _reader.redeliveries_dropped == dropped + 3


@pytest.mark.xfail(
    strict=True,
    reason="Pulsar Lite deviation: has_message_available() (and get_last_message_id) on"
    " a topic without entries fail with UnknownError instead of answering False (-1:-1)",
)
async def test_an_empty_topic_has_no_message_available(broker: PulsarLite) -> None:
    def check(client: pulsar.Client) -> None:
        topic = f"persistent://public/default/empty-{uuid.uuid4().hex}"
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.has_message_available() is False

    await in_plain_client(broker.url, check)


async def test_a_cancelled_fetch_loses_nothing(broker: PulsarLite) -> None:
    async with await walsvc.open_wal(broker.url, pchannel(), interceptors=[]) as wal:
        sent = [(await wal.append(data("c", i))).message_id for i in range(60)]
        scanner = backend_of(wal).read(DeliverPolicy.all(), Filter.everything())
        got: list[walsvc.MessageId] = []
        try:
            async with asyncio.timeout(HANG):
                cancelled = 0
                while len(got) < len(sent):
                    fetch = asyncio.ensure_future(scanner.next_batch())
                    if cancelled < 40:  # cancel the fetch at various points
                        for _ in range(cancelled % 4):
                            await asyncio.sleep(0)
                        fetch.cancel()
                        cancelled += 1
                    try:
                        got += [m.message_id for m in await fetch]
                    except asyncio.CancelledError:
                        pass
        finally:
            await scanner.aclose()
        assert got == sent
        with pytest.raises(walsvc.WALClosed):
            await scanner.next_batch()


async def test_foreign_messages_are_corrupt_records(broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch) as wal:
        topic = backend_of(wal).topic
        newest = (await wal.append(data("d", 0))).message_id
    client = pulsar_asyncio.Client(broker.url, logger=client_logger())
    try:
        producer = await client.create_producer(topic)
        await producer.send(b"not a walsvc record", properties={"walsvc.h": "short"})
    finally:
        await client.close()
    async with await walsvc.open_wal(broker.url, pch, read_only=True) as reader:
        scanner = backend_of(reader).read(DeliverPolicy.all(), Filter.everything())
        try:
            async with asyncio.timeout(HANG):
                with pytest.raises(walsvc.CorruptRecord):
                    await _fetch_until_error(scanner)
        finally:
            await scanner.aclose()
        # The tail (latest id, last tick) skips it: it is not a walsvc record.
        assert await reader.latest_message_id() >= newest


async def _fetch_until_error(scanner: BackendScanner) -> None:
    while True:
        await scanner.next_batch()


# ---------------------------------------------------------------------------------------
# Fencing by the predecessor chain (Milvus issue #53368)


@pytest.mark.xfail(
    strict=True,
    reason="Pulsar Lite deviation: ProducerAccessMode.ExclusiveWithFencing is accepted but"
    " not enforced (the older producer keeps sending)",
)
async def test_broker_fences_an_exclusive_producer(broker: PulsarLite) -> None:
    client = pulsar_asyncio.Client(broker.url, logger=client_logger())
    topic = f"persistent://public/default/exclusive-{uuid.uuid4().hex}"
    mode = pulsar_asyncio.ProducerAccessMode.ExclusiveWithFencing
    try:
        old = await client.create_producer(topic, access_mode=mode)
        await client.create_producer(topic, access_mode=mode)
        with pytest.raises(pulsar_asyncio.PulsarException):
            await old.send(b"after the takeover")
    finally:
        await client.close()


async def test_old_writer_acked_delivered_fenced_not(broker: PulsarLite) -> None:
    pch = pchannel()
    # A bare old writer (no timetick sync), so its first append after the takeover is
    # really sent rather than refused by an earlier timetick's WALFenced.
    old = await walsvc.open_wal(broker.url, pch, interceptors=[])
    try:
        for i in range(3):
            await old.append(data("old", i))
        async with await walsvc.open_wal(broker.url, pch) as new:
            assert new.term > old.term
            with pytest.raises(walsvc.WALFenced):
                await old.append(data("fenced", 0))
            with pytest.raises(walsvc.WALFenced):
                await old.append_many([data("fenced", 1), data("fenced", 2)])
            with pytest.raises(walsvc.WALFenced):  # fenced forever
                await old.append(data("fenced", 3))
            for i in range(2):
                await new.append(data("new", i))
            # The first fenced append reached the topic (Pulsar Lite does not enforce
            # exclusive producers) and every reader drops it; later ones were not sent.
            stored = await raw_payloads(broker.url, backend_of(new).topic)
            assert b"fenced:0" in stored
            assert b"fenced:1" not in stored
            expected = ["old:0", "old:1", "old:2", "new:0", "new:1"]
            assert await read_labels(broker.url, pch, DeliverPolicy.all(), 5) == expected
            async with new.read(DeliverPolicy.all()) as scanner:  # the full pipeline too
                seen = [m.properties["n"] async for m in take_data(scanner, 5)]
            assert seen == expected
    finally:
        await old.aclose()


async def test_a_straggler_before_the_new_writers_group_is_skipped(broker: PulsarLite) -> None:
    """The old writer's append lands between the new writer's barrier and its first
    group: the old writer gets WALFenced (its message is invalid for readers), the new
    writer notices the foreign message, sends its group again after it, and readers see
    exactly the acknowledged messages."""
    pch = pchannel()
    old = await walsvc.open_wal(broker.url, pch, interceptors=[])
    new = await walsvc.open_wal(broker.url, pch, interceptors=[])
    try:
        with pytest.raises(walsvc.WALFenced):
            await old.append(data("straggler", 0))
        await new.append(data("new", 0))
        writer = backend_of(new)._writer
        assert writer is not None
        assert writer.resent == 1
        await new.append(data("new", 1))
        assert writer.resent == 1
        stored = await raw_payloads(broker.url, backend_of(new).topic)
        assert stored.count(b"new:0") == 2  # the invalid first send and the valid resend
        assert b"straggler:0" in stored
        labels = await read_labels(broker.url, pch, DeliverPolicy.all(), 2)
        assert labels == ["new:0", "new:1"]
    finally:
        await old.aclose()
        await new.aclose()


async def test_newer_writer_is_never_fenced_by_an_older_one(broker: PulsarLite) -> None:
    pch = pchannel()
    old = await walsvc.open_wal(broker.url, pch, interceptors=[])
    new = await walsvc.open_wal(broker.url, pch, interceptors=[])
    try:

        async def old_keeps_trying() -> int:
            fenced = 0
            for i in range(20):
                with contextlib.suppress(walsvc.WALFenced):
                    await old.append(data("old", i))
                    continue
                fenced += 1
            return fenced

        async def new_appends() -> list[walsvc.AppendResult]:
            return [await new.append(data("new", i)) for i in range(20)]

        fenced, results = await asyncio.gather(old_keeps_trying(), new_appends())
        assert fenced == 20
        assert len(results) == 20  # none of them raised
        labels = await read_labels(broker.url, pch, DeliverPolicy.all(), 20)
        assert labels == [f"new:{i}" for i in range(20)]
    finally:
        await old.aclose()
        await new.aclose()


async def test_takeover_race_readers_see_exactly_the_acked(broker: PulsarLite) -> None:
    pch = pchannel()
    old = await walsvc.open_wal(broker.url, pch, interceptors=[])
    acked: list[tuple[PulsarMessageId, str]] = []
    failed: list[str] = []
    stop = asyncio.Event()

    async def producer(k: int) -> None:
        i = 0
        while not stop.is_set():
            label = f"old{k}:{i}"
            try:
                result = await old.append(data(label, 0, n=label))
            except walsvc.WALFenced:
                failed.append(label)
                return
            except walsvc.BackendUnavailable:
                failed.append(label)
            else:
                assert isinstance(result.message_id, PulsarMessageId)
                acked.append((result.message_id, label))
            i += 1

    try:
        tasks = [asyncio.create_task(producer(k)) for k in range(8)]
        await asyncio.sleep(0.05)
        new = await walsvc.open_wal(broker.url, pch, interceptors=[])
        try:
            for i in range(10):
                result = await new.append(data("new", i, n=f"new:{i}"))
                assert isinstance(result.message_id, PulsarMessageId)
                acked.append((result.message_id, f"new:{i}"))
            async with asyncio.timeout(HANG):
                await asyncio.gather(*tasks)  # every old producer ends fenced
        finally:
            stop.set()
            await new.aclose()
    finally:
        stop.set()
        await old.aclose()
    assert len(failed) >= 8
    acked.sort()
    expected = [label for _, label in acked]
    assert await read_labels(broker.url, pch, DeliverPolicy.all(), len(expected)) == expected
    middle = len(acked) // 2
    for deliver, want in (
        (DeliverPolicy.start_from(acked[middle][0]), expected[middle:]),
        (DeliverPolicy.start_after(acked[middle][0]), expected[middle + 1 :]),
        (DeliverPolicy.start_after(acked[-1][0]), []),
    ):
        assert await read_labels(broker.url, pch, deliver, len(want)) == want


async def test_a_lone_writer_never_reads_to_check_its_groups(broker: PulsarLite) -> None:
    """The cheap check (contiguous ids) settles every group of an undisturbed writer."""
    async with await walsvc.open_wal(broker.url, pchannel()) as wal:
        await asyncio.gather(*(wal.append(data("a", i)) for i in range(300)))
        writer = backend_of(wal)._writer
        assert writer is not None
        assert writer.resolved_by_reading == 0


# ---------------------------------------------------------------------------------------
# Faults: the broker stops and restarts mid-stream


async def test_broker_restart_mid_stream(own_broker: PulsarLite) -> None:
    """Appends during the outage fail (typed, or by the caller's deadline); after the
    restart every key is retried until it succeeds, reopening the WAL when dedup blocked
    a key whose cancelled append it could not resolve. Every acked message is read back
    once, in id order, and a retried key answers its original id. The outage (five
    appends, each given 0.5 s) lasts about as long as ``operation_timeout`` (2.5 s), so the
    send of the first group in flight times out about when the broker comes back."""
    pch = pchannel()
    url = own_broker.url
    wals = [await walsvc.open_wal(url, pch, operation_timeout=2.5)]
    acked: dict[str, PulsarMessageId] = {}
    outage_outcomes: list[str] = []

    async def append(i: int, deadline: float) -> str:
        message = Message(
            payload=f"m:{i}".encode(),
            vchannel="v",
            properties={"n": f"m:{i}"},
            idempotency_key=walsvc.producer_key("test", i),
        )
        try:
            async with asyncio.timeout(deadline):
                result = await wals[-1].append(message)
        except (walsvc.BackendUnavailable, walsvc.AppendOutcomeUnknown, TimeoutError) as exc:
            return type(exc).__name__
        assert isinstance(result.message_id, PulsarMessageId)
        assert acked.setdefault(f"m:{i}", result.message_id) == result.message_id
        return "ok"

    try:
        for i in range(20):
            assert await append(i, HANG) == "ok"
        own_broker.stop()
        outage_outcomes = [await append(i, 0.5) for i in range(20, 25)]
        own_broker.start()
        for i in [*range(20, 25), 0, 5, 19]:
            async with asyncio.timeout(HANG):
                while (outcome := await append(i, 10.0)) != "ok":
                    if outcome == "AppendOutcomeUnknown":  # the key is blocked: reopen
                        await wals[-1].aclose()
                        wals.append(await walsvc.open_wal(url, pch, operation_timeout=2.5))
                    await asyncio.sleep(0.05)
        for i in range(25, 35):
            assert await append(i, HANG) == "ok"
    finally:
        for wal in wals:
            await wal.aclose()
    assert "ok" not in outage_outcomes
    expected = [label for label, _ in sorted(acked.items(), key=lambda item: item[1])]
    assert len(expected) == 35
    assert await read_labels(url, pch, DeliverPolicy.all(), 35) == expected


async def test_reader_resumes_from_a_checkpoint_without_gap(own_broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(own_broker.url, pch) as wal:
        for i in range(30):
            await wal.append(data("c", i))
        async with wal.read(DeliverPolicy.all()) as scanner:
            first = [m async for m in take_data(scanner, 12)]
        checkpoint = first[-1].checkpoint
        own_broker.restart()
        for i in range(30, 40):
            async with asyncio.timeout(HANG):
                while True:
                    try:
                        await wal.append(data("c", i))
                        break
                    except walsvc.BackendUnavailable:
                        await asyncio.sleep(0.1)
    async with await walsvc.open_wal(own_broker.url, pch, read_only=True) as reader:
        async with reader.read(DeliverPolicy.from_checkpoint(checkpoint)) as scanner:
            rest = [m async for m in take_data(scanner, 28)]
    labels = [m.properties["n"] for m in first + rest]
    assert labels == [f"c:{i}" for i in range(40)]


# ---------------------------------------------------------------------------------------
# The seal: a failed send that the broker persists later never becomes valid


class _LateSends:
    """Stands in for the writer's ``pulsar.asyncio.Producer``: the first ``hold`` sends
    are reported failed (Result.Timeout) but kept, and ``release`` sends them for real
    later: bytes a broker persists after their producer gave up on them (a fault no
    real broker produces on demand). Reports itself disconnected while it holds any."""

    def __init__(self, real: pulsar_asyncio.Producer, hold: int) -> None:
        self.real = real
        self._producer = self
        self._hold = hold
        self.held: list[Any] = []

    def is_connected(self) -> bool:
        return not self.held and bool(self.real.is_connected())

    def send_async(self, message: Any, callback: Callable[[Any, Any], None]) -> None:
        if self._hold > 0:
            self._hold -= 1
            self.held.append(message)
            callback(_pulsar.Result.Timeout, None)
            return
        self.real._producer.send_async(message, callback)

    def flush_async(self, callback: Callable[[Any], None]) -> None:
        self.real._producer.flush_async(callback)

    async def release(self) -> None:
        loop = asyncio.get_running_loop()
        for message in self.held:
            done: asyncio.Future[Any] = loop.create_future()

            def callback(result: Any, _id: Any, done: asyncio.Future[Any] = done) -> None:
                loop.call_soon_threadsafe(done.set_result, result)

            self.real._producer.send_async(message, callback)
            self.real._producer.flush_async(lambda result: None)
            async with asyncio.timeout(HANG):
                assert await done == _pulsar.Result.Ok
        self.held = []


async def test_a_failed_group_persisted_later_stays_invalid(broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, interceptors=[]) as wal:
        await wal.append(data("before", 0))
        writer = backend_of(wal)._writer
        assert writer is not None
        real = writer._producer
        late = _LateSends(real, hold=1)
        writer._producer = late  # type: ignore[assignment]
        with pytest.raises(walsvc.BackendUnavailable):
            await wal.append(data("lost", 0))
        assert writer.sealed == 1
        await late.release()  # the "lost" bytes land now, after the seal
        writer._producer = real
        await wal.append(data("after", 0))
        stored = await raw_payloads(broker.url, backend_of(wal).topic)
        assert b"lost:0" in stored
        assert await read_labels(broker.url, pch, DeliverPolicy.all(), 2) == [
            "before:0",
            "after:0",
        ]
        assert await wal.latest_message_id() is not None


async def test_a_partitioned_topic_is_refused(
    broker: PulsarLite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulsar Lite cannot create partitioned topics (no admin API), so the client's answer
    is stubbed: a topic reported with two partitions is refused with a clear error."""
    pchannel = f"parted-{uuid.uuid4().hex[:8]}"

    async def two_partitions(client: Any, topic: str) -> list[str]:
        return [f"{topic}-partition-0", f"{topic}-partition-1"]

    monkeypatch.setattr(pulsar_backend, "topic_partitions", two_partitions)
    with pytest.raises(walsvc.InvalidArgument, match="has 2 partitions"):
        await walsvc.open_wal(broker.url, pchannel)
    monkeypatch.undo()
    async with await walsvc.open_wal(broker.url, pchannel) as wal:  # one partition: fine
        await wal.append(Message(payload=b"x", vchannel="v"))


async def test_a_tail_read_that_runs_out_of_time_says_where_it_was(broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, interceptors=[]) as wal:
        await wal.append(data("only", 0))
    reader = await walsvc.open_wal(broker.url, pch, read_only=True, operation_timeout=0.001)
    try:
        with pytest.raises(
            walsvc.BackendUnavailable,
            match=r"took longer than 0\.001 s \(looking up the last entry; read up to None\)",
        ):
            await reader.latest_message_id()
    finally:
        await reader.aclose()


class _SlowAcks:
    """Stands in for the writer's producer: every send goes to the broker, its result
    reaches the writer ``delay`` seconds late (a broker slow to acknowledge)."""

    def __init__(self, real: pulsar_asyncio.Producer, delay: float) -> None:
        self.real = real
        self._producer = self
        self._delay = delay

    def is_connected(self) -> bool:
        return bool(self.real.is_connected())

    def send_async(self, message: Any, callback: Callable[[Any, Any], None]) -> None:
        def late(result: Any, message_id: Any) -> None:
            threading.Timer(self._delay, callback, (result, message_id)).start()

        self.real._producer.send_async(message, late)

    def flush_async(self, callback: Callable[[Any], None]) -> None:
        self.real._producer.flush_async(callback)


async def test_a_group_slow_to_be_acknowledged_is_logged(
    broker: PulsarLite, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(walsvc.backends._pulsar._sender, "SLOW_ACKS", 0.1)
    async with await walsvc.open_wal(broker.url, pchannel(), interceptors=[]) as wal:
        writer = backend_of(wal)._writer
        assert writer is not None
        real = writer._producer
        writer._producer = _SlowAcks(real, 0.5)  # type: ignore[assignment]
        with caplog.at_level(logging.WARNING, logger="walsvc.pulsar"):
            result = await wal.append(data("slow", 0))
        writer._producer = real
        assert result.message_id is not None
    (record,) = [r for r in caplog.records if r.name == "walsvc.pulsar"]
    assert record.levelno == logging.WARNING
    assert "1 of the 1 sends of group" in record.getMessage()
    assert "not acknowledged after 0.1 s" in record.getMessage()
