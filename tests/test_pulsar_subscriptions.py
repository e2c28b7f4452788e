"""Durable subscriptions on ``pulsar://`` (Pulsar Lite): the keyed topic ``<prefix>_sub.<P>``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

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
    own_broker,
    pchannel,
    raw_payloads,
    take_data,
)
from _store_support import store_round_trip

import walsvc
from walsvc.backends._pulsar import PulsarMessageId
from walsvc.backends._pulsar import _subscriptions as subscriptions_module
from walsvc.backends._pulsar._subscriptions import PulsarSubscriptionStore

# Fixtures imported from the helper module (pytest finds them by name here).
__all__ = ("broker", "own_broker")


def checkpoint(entry: int | None, tick: int) -> walsvc.Checkpoint:
    return walsvc.Checkpoint(None if entry is None else PulsarMessageId(1, entry), tick)


def store_of(wal: walsvc.WAL) -> PulsarSubscriptionStore:
    store = backend_of(wal).subscriptions()
    assert isinstance(store, PulsarSubscriptionStore)
    return store


async def test_subscription_store_round_trip(broker: PulsarLite) -> None:
    async with await walsvc.open_wal(broker.url, pchannel(), interceptors=[]) as wal:
        store = store_of(wal)
        assert store is backend_of(wal).subscriptions()
        assert store.topic == f"persistent://public/default/walsvc._sub.{wal.pchannel}"
        # Starts before the topic even exists.
        await store_round_trip(store, PulsarMessageId(1, 7), PulsarMessageId(1, 9))
        await store.save("a", checkpoint(3, 50))
        await store.save("b", checkpoint(None, 5))
        # A second store (another WAL on the pchannel) sees the same, read from scratch.
        async with await walsvc.open_wal(broker.url, wal.pchannel, read_only=True) as other:
            assert await store_of(other).names() == ["a", "a" * 200, "b", "b.reader"]
            assert await store_of(other).load("a") == checkpoint(3, 50)
            await store_of(other).save("b", checkpoint(4, 60))
        assert await store.load("b") == checkpoint(4, 60)  # read incrementally


async def test_checkpoint_survives_reopening_and_a_broker_restart(own_broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(own_broker.url, pch, interceptors=[]) as wal:
        await store_of(wal).save("s", checkpoint(11, 200))
        await store_of(wal).save("gone", checkpoint(1, 1))
        await store_of(wal).delete("gone")
    own_broker.restart()
    for read_only in (True, False):
        async with asyncio.timeout(HANG):
            while True:  # the first calls after the restart may find it still starting
                try:
                    wal = await walsvc.open_wal(
                        own_broker.url, pch, read_only=read_only, interceptors=[]
                    )
                    break
                except walsvc.BackendUnavailable:
                    await asyncio.sleep(0.1)
        async with wal:
            store = store_of(wal)
            assert await store.load("s") == checkpoint(11, 200)
            assert await store.names() == ["s"]
    with pytest.raises(walsvc.WALClosed):
        await store.load("s")
    with pytest.raises(walsvc.WALClosed):
        await store.save("s", checkpoint(12, 201))
    with pytest.raises(walsvc.WALClosed):
        backend_of(wal).subscriptions()


async def test_stopped_broker_makes_subscription_calls_backend_unavailable(
    own_broker: PulsarLite,
) -> None:
    async with await walsvc.open_wal(
        own_broker.url, pchannel(), interceptors=[], operation_timeout=1.0
    ) as wal:
        store = store_of(wal)
        await store.save("s", checkpoint(1, 1))
        own_broker.stop()
        for call in (
            lambda: store.save("s", checkpoint(2, 2)),
            lambda: store.load("s"),
            lambda: store.names(),
            lambda: store.delete("s"),
        ):
            with pytest.raises(walsvc.BackendUnavailable):
                async with asyncio.timeout(HANG):
                    await call()
        own_broker.start()
        async with asyncio.timeout(HANG):
            while True:  # the client reconnects; a first call may still fail retriably
                try:
                    assert await store.load("s") == checkpoint(1, 1)
                    break
                except walsvc.BackendUnavailable:
                    await asyncio.sleep(0.1)


async def _raw_subscription_message(
    url: str, topic: str, key: str, value: bytes, properties: dict[str, str] | None = None
) -> None:
    client = pulsar_asyncio.Client(url, logger=client_logger())
    try:
        async with asyncio.timeout(HANG):
            producer = await client.create_producer(topic)
            await producer.send(value, properties=properties, partition_key=key)
    finally:
        await client.close()


class StuckReader:
    """Fault injection: a subscription reader the broker stopped serving. It says more is
    available but delivers nothing ("delivers nothing"), or never answers whether more is
    available ("never answers")."""

    def __init__(self, reader: Any, fault: str) -> None:
        self._reader = reader
        self._fault = fault

    async def has_message_available(self) -> bool:
        if self._fault == "never answers":
            await asyncio.Event().wait()  # never set
        return bool(await self._reader.has_message_available())

    async def next_batch(self) -> Any:
        if self._fault == "delivers nothing":
            await asyncio.Event().wait()
        return await self._reader.next_batch()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


@pytest.mark.parametrize("fault", ["delivers nothing", "never answers"])
async def test_a_subscription_read_replaces_a_stuck_reader(
    broker: PulsarLite, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """After ``STALL`` seconds without a message or an answer, the store's reader is
    replaced by one that resumes after the last checkpoint read: the load succeeds
    instead of failing at the operation timeout."""
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, interceptors=[]) as wal:
        for n in range(3):
            await store_of(wal).save(f"s{n}", checkpoint(n, 10 * n))
    real_create_reader = subscriptions_module.create_reader
    created: list[Any] = []

    async def create_reader(*args: Any, **kwargs: Any) -> Any:
        reader = await real_create_reader(*args, **kwargs)
        created.append(reader)
        return StuckReader(reader, fault) if len(created) == 1 else reader

    monkeypatch.setattr(subscriptions_module, "STALL", 0.2)
    monkeypatch.setattr(subscriptions_module, "create_reader", create_reader)
    async with await walsvc.open_wal(broker.url, pch, read_only=True) as wal:
        store = store_of(wal)
        async with asyncio.timeout(HANG):
            assert await store.names() == ["s0", "s1", "s2"]
            assert await store.load("s2") == checkpoint(2, 20)
        assert store.stalls == 1
    assert len(created) == 2


async def test_damaged_checkpoint_is_corrupt(broker: PulsarLite) -> None:
    async with await walsvc.open_wal(broker.url, pchannel(), interceptors=[]) as wal:
        await wal.append(data("x", 0))
        store = store_of(wal)
        await store.save("s", checkpoint(3, 30))
        await store.save("ok", checkpoint(3, 30))
        value = next(v for v in await raw_payloads(broker.url, store.topic) if v)
        assert value[:4] == b"WSUB"
        damaged = bytearray(value)
        damaged[-1] ^= 0x01  # one bit of the checkpoint text
        await _raw_subscription_message(broker.url, store.topic, "s", bytes(damaged))
        with pytest.raises(walsvc.CorruptRecord, match="CRC32C"):
            await store.load("s")
        assert await store.load("ok") == checkpoint(3, 30)
        async with wal.read(subscription="s") as scanner:
            with pytest.raises(walsvc.CorruptRecord, match="CRC32C"):
                async with asyncio.timeout(HANG):
                    await anext(scanner)
        await _raw_subscription_message(broker.url, store.topic, "../x", b"junk")
        with pytest.raises(walsvc.CorruptRecord, match="not a walsvc subscription record"):
            await store.names()


async def test_subscription_resumes_after_the_last_ack_in_a_new_wal(broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch) as wal:
        sent = [await wal.append(data("m", i)) for i in range(10)]
        async with wal.read(subscription="s", checkpoint_interval=0) as scanner:
            first = [m async for m in take_data(scanner, 4)]
            for message in first:
                await scanner.ack(message)
        assert [m.properties["n"] for m in first] == [f"m:{i}" for i in range(4)]
    async with await walsvc.open_wal(broker.url, pch, read_only=True) as reader:
        assert await store_of(reader).load("s") == first[-1].checkpoint
        async with reader.read(subscription="s") as scanner:
            rest = [m async for m in take_data(scanner, 6)]
        assert [m.properties["n"] for m in rest] == [f"m:{i}" for i in range(4, 10)]
        assert rest[-1].message_id == sent[-1].message_id


async def test_one_scanner_per_subscription_in_the_process(broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch) as wal:
        async with await walsvc.open_wal(broker.url, pch, read_only=True) as other:
            async with wal.read(subscription="s"):
                with pytest.raises(walsvc.SubscriptionBusy):
                    wal.read(subscription="s")
                with pytest.raises(walsvc.SubscriptionBusy):  # another WAL, same pchannel
                    other.read(subscription="s")
            async with other.read(subscription="s"):  # released on close
                pass


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Pulsar Lite deviation: a second consumer on an Exclusive subscription is not"
    " answered with ConsumerBusy; the broker drops the connection and the client retries"
    " until its operation timeout (Result.Timeout)",
)
async def test_a_second_exclusive_consumer_is_refused_as_busy(broker: PulsarLite) -> None:
    topic = f"persistent://public/default/claim-{uuid.uuid4().hex}"
    first = pulsar_asyncio.Client(broker.url, logger=client_logger())
    second = pulsar_asyncio.Client(broker.url, logger=client_logger(), operation_timeout_seconds=1)
    try:
        async with asyncio.timeout(HANG):
            holder = await first.subscribe(
                topic, "claim", consumer_type=pulsar.ConsumerType.Exclusive
            )
            with pytest.raises(pulsar_asyncio.PulsarException) as refused:
                await second.subscribe(topic, "claim", consumer_type=pulsar.ConsumerType.Exclusive)
        assert refused.value.error() == pulsar.Result.ConsumerBusy
        await holder.close()
    finally:
        await first.close()
        await second.close()


class _GivenUp:
    """Stands in for a checkpoint producer pulsar-client 3.12 gave up on (see
    ``_producers``): never connected again; a send fails as its send timeout fails it."""

    def __init__(self, real: pulsar_asyncio.Producer) -> None:
        self.real = real
        self._producer = self
        self.closed = False

    def is_connected(self) -> bool:
        return False

    def send_async(self, message: Any, callback: Any) -> None:
        callback(pulsar.Result.Timeout, None)

    async def close(self) -> None:
        self.closed = True
        await self.real.close()


async def test_a_checkpoint_producer_pulsar_client_gave_up_on_is_replaced(
    broker: PulsarLite,
) -> None:
    """The write that meets it fails (retriably); the next one makes a new producer."""
    async with await walsvc.open_wal(broker.url, pchannel()) as wal:
        store = store_of(wal)
        await store.save("a", checkpoint(3, 50))
        given_up = _GivenUp(store._producer)  # type: ignore[arg-type]
        store._producer = given_up  # type: ignore[assignment]
        with pytest.raises(walsvc.BackendUnavailable):
            await store.save("a", checkpoint(4, 60))
        assert given_up.closed
        await store.save("a", checkpoint(5, 70))
        assert store._producer is not given_up
        async with await walsvc.open_wal(broker.url, wal.pchannel, read_only=True) as other:
            assert await store_of(other).load("a") == checkpoint(5, 70)
