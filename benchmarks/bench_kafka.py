"""The ``kafka://`` backend against the raw aiokafka client, on a Tansu broker.

Every benchmark starts its own Tansu broker (``walsvc.testing._tansu``, in memory, on a
loopback port) in ``setup`` and stops it by pid in ``teardown``; both sides of a ratio
talk to that broker in the same process, alternately (raw, walsvc, raw, ...), best of
three each. Payloads are 100 bytes. Absolute rates go to stderr.

Appends (``KafkaAppendRatio``). walsvc: ``open_wal("kafka://...", fresh pchannel)`` with
the default options and the default interceptor chain, 64 producers each awaiting its own
``append`` (vchannel ``v{i % 16}``). Raw: an ``AIOKafkaProducer`` on a fresh one-partition
topic, 64 producers each awaiting ``send_and_wait(topic, payload, partition=0)``. What is
matched, from walsvc's ``_client.new_producer`` and ``_writer``: acks="all", no
idempotence, no compression, ``linger_ms=0``, batches up to walsvc's ``max_batch_bytes``
(1 MiB: the raw producer's ``max_batch_size``), ``max_request_size`` = 2 MiB + 64 KiB,
one request in flight (aiokafka sends one request per broker at a time; walsvc's writer
one batch at a time), topics created with the same ``max.message.bytes``. So both
group-commit: what is queued while a batch is in flight goes out as the next batch.
Not matched (walsvc's own cost): the envelope and the headers ``walsvc.h``/``walsvc.o``
per record (the raw records have no key and no headers), the interceptor chain and its
TimeTicks (one every 10 ms). Each run opens a fresh WAL or producer, warms up for 0.2 s
and measures for 1 s.

Scans (``KafkaScanRatio``). ``setup`` fills one topic with MESSAGES messages through
walsvc (``append_many`` of 1000, no interceptors, so the topic holds a barrier and the
messages). walsvc: a read-only WAL opened in ``setup``; each run ``wal.read(
DeliverPolicy.all())`` with ``batches()``, reading every message's payload, until the
last one. Raw: an ``AIOKafkaConsumer`` without a group (the fetch settings walsvc's
scanners use: 100 ms fetch wait, 2 MiB per partition fetch), ``assign`` +
``seek_to_beginning`` + ``getmany`` until the last offset, reading the value and the
headers of every record. Both time from creating their consumer to the last message;
the rate is MESSAGES / elapsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Awaitable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import walsvc
from walsvc import AppendResult, DeliverPolicy, Message
from walsvc.backends._kafka import KafkaMessageId
from walsvc.testing._tansu import TansuBroker, start_tansu

from ._common import (
    PAYLOAD,
    PRODUCERS,
    VCHANNELS,
    BrokerBench,
    best_ratio,
    closed_loop_rate,
    note,
)

SECONDS = 1.0
WARMUP = 0.2
#: Messages in the scanned topic.
MESSAGES = 100_000
FILL_BATCH = 1000
#: A run that takes longer than this fails instead of hanging the benchmark.
RUN_DEADLINE = 30.0

#: walsvc's defaults (walsvc.backends._kafka): max_batch_bytes, and the producer's
#: max_request_size = 2 * max_batch_bytes + 64 KiB, the topics' max.message.bytes.
MAX_BATCH_BYTES = 1024 * 1024
MAX_REQUEST_SIZE = 2 * MAX_BATCH_BYTES + 64 * 1024
TOPIC_MAX_MESSAGE_BYTES = 32 * 1024 * 1024 + 64 * 1024  # max(1 MiB, 32 MiB max message) + slack
FETCH_WAIT_MS = 100
PARTITION_FETCH_BYTES = 2 * MAX_BATCH_BYTES

_names = itertools.count()


def _fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:8]}"


async def _create_topic(servers: str, topic: str) -> None:
    """A one-partition topic made explicitly (Tansu would auto-create several)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        configs = {"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}
        response = await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
        code = response.topic_errors[0][1]
        if code != 0:
            raise RuntimeError(f"creating {topic} failed with error code {code}")
    finally:
        await admin.close()


# -- appends ------------------------------------------------------------------------------


async def walsvc_append_rate(broker: TansuBroker) -> float:
    """Messages/s of 64 producers each awaiting ``append`` on a fresh kafka:// WAL."""
    async with asyncio.timeout(RUN_DEADLINE):
        wal = await walsvc.open_wal(broker.url, _fresh("append"))
        try:

            def append_one(i: int) -> Awaitable[AppendResult]:
                return wal.append(Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]))

            await closed_loop_rate(append_one, producers=PRODUCERS, seconds=WARMUP)
            return await closed_loop_rate(append_one, producers=PRODUCERS, seconds=SECONDS)
        finally:
            await wal.aclose()


async def raw_append_rate(broker: TansuBroker) -> float:
    """Records/s of 64 producers each awaiting ``send_and_wait`` on a raw producer
    configured like walsvc's (see the module docstring)."""
    async with asyncio.timeout(RUN_DEADLINE):
        topic = _fresh("raw-append")
        await _create_topic(broker.bootstrap_servers, topic)
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap_servers,
            acks="all",
            enable_idempotence=False,
            linger_ms=0,
            max_batch_size=MAX_BATCH_BYTES,
            max_request_size=MAX_REQUEST_SIZE,
            request_timeout_ms=30_000,
        )
        await producer.start()
        try:

            def send_one(i: int) -> Awaitable[Any]:
                sent: Awaitable[Any] = producer.send_and_wait(topic, PAYLOAD, partition=0)
                return sent

            await closed_loop_rate(send_one, producers=PRODUCERS, seconds=WARMUP)
            return await closed_loop_rate(send_one, producers=PRODUCERS, seconds=SECONDS)
        finally:
            await producer.stop()


# -- scans --------------------------------------------------------------------------------


async def fill_topic(broker: TansuBroker, pchannel: str) -> int:
    """Append MESSAGES messages through walsvc (no interceptors); return the offset of
    the last one."""
    batch = [Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(FILL_BATCH)]
    async with await walsvc.open_wal(broker.url, pchannel, interceptors=[]) as wal:
        results = await asyncio.gather(
            *(wal.append_many(batch) for _ in range(MESSAGES // FILL_BATCH))
        )
    last = max(r[-1].message_id for r in results)
    assert isinstance(last, KafkaMessageId)
    return last.seq


async def walsvc_scan_rate(wal: walsvc.WAL) -> float:
    """Messages/s of ``wal.read(DeliverPolicy.all())`` to the last of MESSAGES messages,
    every payload read."""
    start = time.perf_counter()
    seen = 0
    payload_bytes = 0
    async with (
        asyncio.timeout(RUN_DEADLINE),
        wal.read(DeliverPolicy.all()) as scanner,
        contextlib.aclosing(scanner.batches()) as batches,
    ):
        async for batch in batches:
            seen += len(batch)
            for message in batch:
                payload_bytes += len(message.payload)
            if seen >= MESSAGES:
                break
    elapsed = time.perf_counter() - start
    if seen != MESSAGES or payload_bytes != MESSAGES * len(PAYLOAD):
        raise AssertionError(f"walsvc scan saw {seen} messages, {payload_bytes} payload bytes")
    return MESSAGES / elapsed


async def raw_scan_rate(broker: TansuBroker, topic: str, last_offset: int) -> float:
    """Messages/s of a group-less AIOKafkaConsumer reading the topic from its start to
    ``last_offset``, every record's value and headers read."""
    start = time.perf_counter()
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_WAIT_MS,
        max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
        request_timeout_ms=30_000,
    )
    records = 0
    value_bytes = 0
    headers = 0
    async with asyncio.timeout(RUN_DEADLINE):
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            offset = -1
            while offset < last_offset:
                for record in (await consumer.getmany(tp, timeout_ms=200)).get(tp, ()):
                    records += 1
                    value_bytes += len(record.value)
                    headers += len(record.headers)
                    offset = record.offset
        finally:
            await consumer.stop()
    elapsed = time.perf_counter() - start
    # Every data record has a value of 100 bytes and two headers; the barrier before
    # them an empty value and one header.
    if value_bytes != MESSAGES * len(PAYLOAD) or headers != 2 * MESSAGES + 1:
        raise AssertionError(
            f"raw scan read {records} records, {value_bytes} value bytes, {headers} headers"
        )
    return MESSAGES / elapsed


# -- asv classes --------------------------------------------------------------------------


class _KafkaBench(BrokerBench):
    """A Tansu broker of the benchmark's own."""

    timeout = 120

    def start_broker(self) -> TansuBroker:
        return start_tansu()


class KafkaAppendRatio(_KafkaBench):
    """walsvc kafka:// appends over the raw aiokafka producer, alternately, best of three."""

    def track_append_ratio(self, loop: str) -> float:
        """64 producers each awaiting one 100-byte append (target >= 0.8)."""
        broker = self.broker
        return best_ratio(
            self.loop,
            "append",
            ("raw aiokafka", lambda: raw_append_rate(broker)),
            ("walsvc kafka://", lambda: walsvc_append_rate(broker)),
        )


class KafkaScanRatio(_KafkaBench):
    """walsvc kafka:// scan from the start over the raw aiokafka consumer, alternately,
    best of three, on one topic of MESSAGES messages filled in ``setup``."""

    def setup(self, loop: str) -> None:
        super().setup(loop)
        try:
            pchannel = _fresh("scan")
            began = time.perf_counter()
            self.last_offset = self.loop.run_until_complete(fill_topic(self.broker, pchannel))
            note(f"scan: filled {MESSAGES} messages in {time.perf_counter() - began:.2f} s")
            self.topic = f"walsvc.{pchannel}"
            self.wal = self.loop.run_until_complete(
                walsvc.open_wal(self.broker.url, pchannel, read_only=True)
            )
        except BaseException:
            super().teardown(loop)
            raise

    def teardown(self, loop: str) -> None:
        try:
            self.loop.run_until_complete(self.wal.aclose())
        finally:
            super().teardown(loop)

    def track_scan_ratio(self, loop: str) -> float:
        """Messages/s until the last of MESSAGES, from the start (target >= 0.8)."""
        broker, wal = self.broker, self.wal
        return best_ratio(
            self.loop,
            "scan",
            ("raw aiokafka", lambda: raw_scan_rate(broker, self.topic, self.last_offset)),
            ("walsvc kafka://", lambda: walsvc_scan_rate(wal)),
        )
