"""The ``pulsar://`` backend against the raw ``pulsar.asyncio`` client, on Pulsar Lite.

Every benchmark starts its own Pulsar Lite broker (``walsvc.testing._pulsar_lite``, on a
loopback port, data in a temporary directory) in ``setup`` and stops it by pid in
``teardown``; both sides of a ratio talk to that broker in the same process, alternately
(raw, walsvc, raw, ...), best of three each. Payloads are 100 bytes. Absolute rates go to
stderr.

Appends (``PulsarAppendRatio``). walsvc: ``open_wal("pulsar://...", fresh pchannel)`` with
the default options and the default interceptor chain, 64 producers each awaiting its own
``append`` (vchannel ``v{i % 16}``). Raw: a ``pulsar.asyncio`` producer on a fresh topic,
64 producers each awaiting ``producer.send(payload)``. What is matched, from walsvc's
``_backend._create_producer`` and the defaults of ``_client.Options`` (read at import, so
they follow the backend): ``batching_enabled=True``, ``batching_max_messages`` (1000),
``batching_max_publish_delay_ms`` (10 ms), ``max_pending_messages=100_000``,
``block_if_queue_full=False``, ``send_timeout_millis`` = ``operation_timeout`` (30 s),
``access_mode=ExclusiveWithFencing``; the client's ``operation_timeout_seconds`` and
``connection_timeout_ms`` as ``_clients.lease`` sets them; batches up to the client's
default 128 KiB in both. Not matched, by design: walsvc's writer calls ``flush`` after
sending each group (so its batches leave as soon as the group is queued), while
``producer.send`` leaves its message to the batch timer: with 64 producers the raw
batches never reach 1000 messages, so each waits out the publish delay. stderr also
shows the raw producer with a 1 ms delay (the fairer baseline found by the earlier
measurement, ``tests/_pulsar_measure.py``); the ratio is over the matched raw producer.
Not matched either (walsvc's own cost): the envelope split into data + three properties
per message (``walsvc.h``, ``walsvc.prev``, ``walsvc.grp``; the raw messages have none),
the interceptor chain and its TimeTicks. Each run opens a fresh WAL or producer, warms
up for 0.2 s and measures for 1 s.

Scans (``PulsarScanRatio``). ``setup`` fills one topic with MESSAGES messages through
walsvc (``append_many`` of 1000, no interceptors, so the topic holds a barrier and the
messages). walsvc: a read-only WAL opened in ``setup``; each run ``wal.read(
DeliverPolicy.all())`` with ``batches()``, reading every message's payload, until the
last one. Raw: a ``pulsar.asyncio`` Reader from ``MessageId.earliest`` with walsvc's
scanner's ``receiver_queue_size`` (1000), ``read_next`` until the last message, reading
``data()`` and ``properties()`` of every message. Both time from creating their reader
(walsvc: ``wal.read``) to the last message; the rate is MESSAGES / elapsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
import uuid
from collections.abc import Awaitable
from typing import Any, Final

import pulsar
import pulsar.asyncio as pulsar_asyncio

import walsvc
from walsvc import AppendResult, DeliverPolicy, Message
from walsvc.backends._pulsar._client import Options
from walsvc.testing._pulsar_lite import PulsarLite, start_pulsar_lite

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
MESSAGES = 50_000
FILL_BATCH = 1000
#: A run that takes longer than this fails instead of hanging the benchmark.
RUN_DEADLINE = 60.0

#: walsvc's defaults (walsvc.backends._pulsar._client.Options) that the raw side copies.
DEFAULTS: Final = Options()
#: walsvc's producer (walsvc.backends._pulsar._backend._create_producer).
MAX_PENDING_MESSAGES = 100_000
#: walsvc's scanner (walsvc.backends._pulsar._log.create_reader).
RECEIVER_QUEUE_SIZE = 1000
#: The delay of the stderr-only raw variant (the earlier measurement's fair baseline).
SHORT_DELAY_MS = 1

_names = itertools.count()
_quiet = logging.getLogger("walsvc.bench.pulsar")
_quiet.setLevel(logging.CRITICAL)
logging.getLogger("walsvc.pulsar").setLevel(logging.CRITICAL)


def _fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:8]}"


def _raw_client(broker: PulsarLite) -> pulsar_asyncio.Client:
    """A client configured as walsvc's ``_clients.lease`` configures its own."""
    return pulsar_asyncio.Client(
        broker.url,
        operation_timeout_seconds=max(1, math.ceil(DEFAULTS.operation_timeout)),
        connection_timeout_ms=max(1, int(DEFAULTS.connect_timeout * 1000)),
        logger=_quiet,
    )


# -- appends ------------------------------------------------------------------------------


async def walsvc_append_rate(broker: PulsarLite) -> float:
    """Messages/s of 64 producers each awaiting ``append`` on a fresh pulsar:// WAL."""
    async with asyncio.timeout(RUN_DEADLINE):
        wal = await walsvc.open_wal(broker.url, _fresh("append"))
        try:

            def append_one(i: int) -> Awaitable[AppendResult]:
                return wal.append(Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]))

            await closed_loop_rate(append_one, producers=PRODUCERS, seconds=WARMUP)
            return await closed_loop_rate(append_one, producers=PRODUCERS, seconds=SECONDS)
        finally:
            await wal.aclose()


async def raw_append_rate(broker: PulsarLite, delay_ms: int) -> float:
    """Messages/s of 64 producers each awaiting ``send`` on a raw producer configured
    like walsvc's, with a publish delay of ``delay_ms`` (see the module docstring)."""
    async with asyncio.timeout(RUN_DEADLINE):
        client = _raw_client(broker)
        try:
            producer = await client.create_producer(
                f"persistent://public/default/{_fresh('raw-append')}",
                send_timeout_millis=max(1, int(DEFAULTS.operation_timeout * 1000)),
                batching_enabled=True,
                batching_max_messages=DEFAULTS.batching_max_messages,
                batching_max_publish_delay_ms=delay_ms,
                max_pending_messages=MAX_PENDING_MESSAGES,
                block_if_queue_full=False,
                access_mode=pulsar_asyncio.ProducerAccessMode.ExclusiveWithFencing,
            )

            def send_one(i: int) -> Awaitable[Any]:
                sent: Awaitable[Any] = producer.send(PAYLOAD)
                return sent

            try:
                await closed_loop_rate(send_one, producers=PRODUCERS, seconds=WARMUP)
                return await closed_loop_rate(send_one, producers=PRODUCERS, seconds=SECONDS)
            finally:
                await producer.close()
        finally:
            await client.close()


# -- scans --------------------------------------------------------------------------------


async def fill_topic(broker: PulsarLite, pchannel: str) -> None:
    """Append MESSAGES messages through walsvc (no interceptors)."""
    async with asyncio.timeout(RUN_DEADLINE):
        async with await walsvc.open_wal(broker.url, pchannel, interceptors=[]) as wal:
            batch = [
                Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(FILL_BATCH)
            ]
            for _ in range(MESSAGES // FILL_BATCH):
                await wal.append_many(batch)


async def walsvc_scan_rate(wal: walsvc.WAL) -> float:
    """Messages/s of a read-only WAL's ``read(DeliverPolicy.all())`` to the last one."""
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
            payload_bytes += sum(len(m.payload) for m in batch)
            if seen >= MESSAGES:
                break
    elapsed = time.perf_counter() - start
    if (seen, payload_bytes) != (MESSAGES, MESSAGES * len(PAYLOAD)):
        raise AssertionError(f"walsvc scan read {seen} messages, {payload_bytes} payload bytes")
    return MESSAGES / elapsed


async def raw_scan_rate(broker: PulsarLite, topic: str) -> float:
    """Messages/s of a raw Reader from the earliest message to the last one (the barrier
    and MESSAGES data messages), reading each message's data and properties. The reader
    is pulsar-client's synchronous one (the version walsvc requires has no asynchronous
    reader), in one worker thread that reads with no hand-over per message."""
    start = time.perf_counter()

    def scan() -> tuple[int, int, int, int]:
        count = data_bytes = properties = 0
        data_properties = 0  # of the messages with data: not the barrier's
        client = pulsar.Client(
            broker.url,
            operation_timeout_seconds=max(1, math.ceil(DEFAULTS.operation_timeout)),
            connection_timeout_ms=max(1, int(DEFAULTS.connect_timeout * 1000)),
            logger=_quiet,
        )
        try:
            reader = client.create_reader(
                topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE_SIZE
            )
            try:
                while count <= MESSAGES:  # the barrier, then MESSAGES messages
                    message = reader.read_next(int(RUN_DEADLINE * 1000))
                    count += 1
                    size, found = len(message.data()), len(message.properties())
                    data_bytes += size
                    properties += found
                    data_properties += found if size else 0
            finally:
                reader.close()
        finally:
            client.close()
        return count, data_bytes, properties, data_properties

    async with asyncio.timeout(RUN_DEADLINE):
        count, data_bytes, properties, data_properties = await asyncio.to_thread(scan)
    elapsed = time.perf_counter() - start
    # Every data message has 100 bytes of data and three properties; the barrier before
    # them has no data (and properties of its own: the barrier mark, the writer's name).
    if data_bytes != MESSAGES * len(PAYLOAD) or data_properties != 3 * MESSAGES:
        raise AssertionError(
            f"raw scan read {count} messages, {data_bytes} data bytes, {properties} properties"
        )
    return MESSAGES / elapsed


# -- asv classes --------------------------------------------------------------------------


class _PulsarBench(BrokerBench):
    """A Pulsar Lite broker of the benchmark's own (in a temporary directory)."""

    def start_broker(self) -> PulsarLite:
        return start_pulsar_lite()


class PulsarAppendRatio(_PulsarBench):
    """walsvc pulsar:// appends over the raw pulsar.asyncio producer, alternately, best
    of three: 64 producers each awaiting one 100-byte append."""

    def _ratio(self, delay_ms: int) -> float:
        broker = self.broker
        return best_ratio(
            self.loop,
            "append",
            (f"raw pulsar.asyncio, {delay_ms} ms delay", lambda: raw_append_rate(broker, delay_ms)),
            ("walsvc pulsar://", lambda: walsvc_append_rate(broker)),
        )

    def track_append_ratio(self, loop: str) -> float:
        """Over the raw producer with walsvc's batching settings, its publish delay
        included (10 ms: the raw side waits out the timer; target >= 0.8)."""
        return self._ratio(DEFAULTS.batching_max_publish_delay_ms)

    def track_append_vs_short_delay_ratio(self, loop: str) -> float:
        """Over the same raw producer with a 1 ms publish delay (the fastest raw setting
        found here for 64 producers: the baseline that ``flush``-free sends can reach)."""
        return self._ratio(SHORT_DELAY_MS)


class PulsarScanRatio(_PulsarBench):
    """walsvc pulsar:// scan from the start over a raw pulsar-client Reader,
    alternately, best of three, on one topic of MESSAGES messages filled in ``setup``."""

    def setup(self, loop: str) -> None:
        super().setup(loop)
        try:
            pchannel = _fresh("scan")
            began = time.perf_counter()
            self.loop.run_until_complete(fill_topic(self.broker, pchannel))
            note(f"scan: filled {MESSAGES} messages in {time.perf_counter() - began:.2f} s")
            self.topic = f"{DEFAULTS.topic_prefix}{pchannel}"
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
        broker, wal, topic = self.broker, self.wal, self.topic
        return best_ratio(
            self.loop,
            "scan",
            ("raw pulsar-client Reader", lambda: raw_scan_rate(broker, topic)),
            ("walsvc pulsar://", lambda: walsvc_scan_rate(wal)),
        )
