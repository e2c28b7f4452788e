"""Pulsar writers against a real Pulsar-protocol broker (Pulsar Lite): fencing by the
predecessor chain (Milvus issue #53368: an old writer's appends after a takeover fail
with ``WALFenced`` and readers drop whatever of them reached the topic, a newer writer
is never fenced by an older one, readers see exactly the acknowledged messages), the
seal (a failed send the broker persists later never becomes valid), and a group slow to
be acknowledged, which is logged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pulsar.asyncio as pulsar_asyncio
import pytest
from _pulsar_lite import (
    HANG,
    PulsarLite,
    backend_of,
    broker,
    client_logger,
    data,
    pchannel,
    raw_payloads,
    read_labels,
    take_data,
)
from pulsar import _pulsar

import walsvc
import walsvc.backends._pulsar._writer
from walsvc import DeliverPolicy
from walsvc.backends._pulsar import PulsarMessageId
from walsvc.backends._pulsar._calls import close
from walsvc.backends._pulsar._producers import ProducerKeeper

# Fixtures imported from the helper module (pytest finds them by name here).
__all__ = ("broker",)


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
        real = writer._producers._producer
        late = _LateSends(real, hold=1)
        writer._producers._producer = late  # type: ignore[assignment]
        with pytest.raises(walsvc.BackendUnavailable):
            await wal.append(data("lost", 0))
        assert writer.sealed == 1
        await late.release()  # the "lost" bytes land now, after the seal
        writer._producers._producer = real
        await wal.append(data("after", 0))
        stored = await raw_payloads(broker.url, backend_of(wal).topic)
        assert b"lost:0" in stored
        assert await read_labels(broker.url, pch, DeliverPolicy.all(), 2) == [
            "before:0",
            "after:0",
        ]
        assert await wal.latest_message_id() is not None


# ---------------------------------------------------------------------------------------
# A group slow to be acknowledged


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
        real = writer._producers._producer
        writer._producers._producer = _SlowAcks(real, 0.5)  # type: ignore[assignment]
        with caplog.at_level(logging.WARNING, logger="walsvc.pulsar"):
            result = await wal.append(data("slow", 0))
        writer._producers._producer = real
        assert result.message_id is not None
    (record,) = [r for r in caplog.records if r.name == "walsvc.pulsar"]
    assert record.levelno == logging.WARNING
    assert "1 of the 1 sends of group" in record.getMessage()
    assert "not acknowledged after 0.1 s" in record.getMessage()


# ---------------------------------------------------------------------------------------
# A producer pulsar-client gave up on


class _GivenUp:
    """Stands in for a producer pulsar-client 3.12 gave up on: its reconnection was
    cancelled for good (the start timeout of ``_producers``' docstring), so it never
    connects again. pulsar-client gets there only when a disconnection meets that
    timeout (3 runs in 62 of one seed of the fault schedule), not on demand."""

    def __init__(self, real: pulsar_asyncio.Producer) -> None:
        self.real = real
        self._producer = real._producer
        self.closed = False

    def is_connected(self) -> bool:
        return False

    async def close(self) -> None:
        self.closed = True
        await close(self.real)


async def _given_up_after_one_append(wal: walsvc.WAL) -> tuple[ProducerKeeper, _GivenUp]:
    """Append "before:0", then swap the writer's producer for a ``_GivenUp``."""
    await wal.append(data("before", 0))
    writer = backend_of(wal)._writer
    assert writer is not None
    producers = writer._producers
    given_up = _GivenUp(producers._producer)  # type: ignore[arg-type]
    producers._producer = given_up  # type: ignore[assignment]
    return producers, given_up


async def test_a_producer_pulsar_client_gave_up_on_is_replaced(broker: PulsarLite) -> None:
    """Appends fail fast (retriably) while the producer is disconnected; once it has been
    seen so for the operation timeout (1 s) the writer makes a new producer and closes
    the old one, and the appends the WAL retried meanwhile land, each once, in order."""
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, operation_timeout=1.0) as wal:
        producers, given_up = await _given_up_after_one_append(wal)
        async with asyncio.timeout(HANG):  # the WAL's Redo retries BackendUnavailable
            for i in range(3):
                await wal.append(data("after", i))
        assert producers.replaced == 1
        assert given_up.closed
        assert producers._producer is not given_up
        assert await read_labels(broker.url, pch, DeliverPolicy.all(), 4) == [
            "before:0",
            "after:0",
            "after:1",
            "after:2",
        ]


async def test_a_refused_replacement_without_a_newer_writer_is_no_fence(
    broker: PulsarLite,
) -> None:
    """The broker may refuse the new producer as the holder of another's exclusive
    access (``ProducerBusy``: it still holds this writer's old producer). With no newer
    writer's barrier in the log that is no fence: the appends fail retriably, and the
    next replacement lands them."""
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, operation_timeout=1.0) as wal:
        producers, _ = await _given_up_after_one_append(wal)
        make = producers._make
        refusals = 0

        async def refused_once() -> pulsar_asyncio.Producer:
            nonlocal refusals
            if refusals == 0:
                refusals += 1
                raise walsvc.WALFenced("ProducerBusy: another exclusive producer holds it")
            return await make()

        producers._make = refused_once
        async with asyncio.timeout(HANG):  # the WAL's Redo retries BackendUnavailable
            await wal.append(data("after", 0))
        assert (refusals, producers.replaced) == (1, 1)
        assert await read_labels(broker.url, pch, DeliverPolicy.all(), 2) == [
            "before:0",
            "after:0",
        ]
