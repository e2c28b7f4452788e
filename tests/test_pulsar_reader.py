"""``OrderedReader`` against Pulsar Lite: every message once and in order while keeping up
with a writer, waking at the end of a topic, cancellation and close."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_asyncio
import pytest
from _pulsar_lite import HANG, PulsarLite, broker, client_logger

import walsvc
from walsvc.backends._pulsar import PulsarMessageId
from walsvc.backends._pulsar._reader import OrderedReader

# Fixtures imported from the helper module (pytest finds them by name here).
__all__ = ("broker",)


class _NoAsyncReceive:
    """The C reader, except that an asynchronous receive fails the test: the order of
    what it delivers is not guaranteed (see ``walsvc.backends._pulsar._reader``)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def read_next_async(self, callback: Any) -> None:
        raise AssertionError("OrderedReader used the client's asynchronous receive")


@pytest.fixture
async def topic_client(broker: PulsarLite) -> AsyncIterator[tuple[pulsar_asyncio.Client, str]]:
    client = pulsar_asyncio.Client(broker.url, logger=client_logger())
    try:
        yield client, f"persistent://public/default/ordered-{uuid.uuid4().hex}"
    finally:
        await client.close()


async def _reader(client: pulsar_asyncio.Client, topic: str, start: Any) -> OrderedReader:
    reader = await client.create_reader(topic, start, receiver_queue_size=1000)
    reader._reader = _NoAsyncReceive(reader._reader)
    return OrderedReader(reader)


async def test_a_reader_keeping_up_with_its_writer_gets_every_message_once_in_order(
    topic_client: tuple[pulsar_asyncio.Client, str],
) -> None:
    """Unbatched messages sent 20 at a time while the reader reads at the end of the
    topic: the case where ``read_next_async`` can deliver a message ahead of its
    predecessor."""
    client, topic = topic_client
    producer = await client.create_producer(topic, batching_enabled=False)
    reader = await _reader(client, topic, pulsar.MessageId.earliest)
    count = 3000
    sent: list[PulsarMessageId] = []

    async def produce() -> None:
        for first in range(0, count, 20):
            ids = await asyncio.gather(
                *(producer.send(b"%d" % i) for i in range(first, first + 20))
            )
            sent.extend(PulsarMessageId.of(i) for i in ids)

    got: list[PulsarMessageId] = []
    payloads: list[bytes] = []
    async with asyncio.timeout(HANG):
        producing = asyncio.create_task(produce())
        while len(got) < count:
            for message_id, message in await reader.next_batch():
                got.append(message_id)
                payloads.append(message.data())
        await producing
    await reader.close()
    await producer.close()
    assert got == sorted(set(got)), "ids not strictly increasing"
    assert got == sorted(sent)
    assert sorted(payloads, key=int) == [b"%d" % i for i in range(count)]


@pytest.fixture
async def at_the_end(
    topic_client: tuple[pulsar_asyncio.Client, str],
) -> AsyncIterator[tuple[pulsar_asyncio.Producer, OrderedReader]]:
    """A producer and a reader that has read the one message of its topic."""
    client, topic = topic_client
    producer = await client.create_producer(topic)
    await producer.send(b"first")
    reader = await _reader(client, topic, pulsar.MessageId.earliest)
    async with asyncio.timeout(HANG):
        assert [m.data() for _, m in await reader.next_batch()] == [b"first"]
    yield producer, reader
    await reader.close()
    await producer.close()


async def test_a_reader_at_the_end_wakes_for_the_next_message(
    at_the_end: tuple[pulsar_asyncio.Producer, OrderedReader],
) -> None:
    producer, reader = at_the_end
    async with asyncio.timeout(HANG):
        waiting = asyncio.create_task(reader.next_batch())
        await asyncio.sleep(0.5)  # longer than one blocking pop: it waits again
        assert not waiting.done()
        await producer.send(b"second")
        assert [m.data() for _, m in await waiting] == [b"second"]


async def test_a_cancelled_read_loses_nothing(
    at_the_end: tuple[pulsar_asyncio.Producer, OrderedReader],
) -> None:
    producer, reader = at_the_end
    async with asyncio.timeout(HANG):
        for _ in range(3):  # each cancelled while its worker waits for a message
            waiting = asyncio.create_task(reader.next_batch())
            await asyncio.sleep(0.05)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        with pytest.raises(RuntimeError, match="cancelled read"):
            await reader.has_message_available()
        await producer.send(b"second")
        assert [m.data() for _, m in await reader.next_batch()] == [b"second"]
        assert not await reader.has_message_available()


async def test_closing_ends_a_waiting_read_at_once(
    at_the_end: tuple[pulsar_asyncio.Producer, OrderedReader],
) -> None:
    _, reader = at_the_end
    async with asyncio.timeout(HANG):
        waiting = asyncio.create_task(reader.next_batch())
        await asyncio.sleep(0.05)
        await reader.close()
        with pytest.raises(walsvc.WALClosed):
            await waiting
