"""Starting and stopping aiokafka clients with deadlines, errors translated.

Every client start is bounded by ``connect_timeout``; every client stop by
``request_timeout``. aiokafka's exceptions become ``BackendUnavailable`` here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from ..._errors import BackendUnavailable
from ._options import KafkaOptions

__all__ = ("ms", "new_admin", "new_consumer", "new_producer", "stop_quietly")


async def _start(client: Any, what: str, servers: list[str], options: KafkaOptions) -> None:
    try:
        async with asyncio.timeout(options.connect_timeout):
            await client.start()
    except (TimeoutError, KafkaError, OSError) as exc:
        await stop_quietly(client, options)
        raise BackendUnavailable(
            f"cannot reach Kafka at {','.join(servers)} ({what}) within"
            f" {options.connect_timeout} s: {exc!r}"
        ) from exc


async def stop_quietly(client: Any, options: KafkaOptions) -> None:
    """Stop an aiokafka client, giving up after ``request_timeout``; never raises."""
    stop = client.close if isinstance(client, AIOKafkaAdminClient) else client.stop
    try:
        async with asyncio.timeout(options.request_timeout):
            await stop()
    except (TimeoutError, KafkaError, OSError):
        pass


def ms(seconds: float) -> int:
    """``seconds`` as the whole milliseconds aiokafka takes (at least 1)."""
    return max(1, int(seconds * 1000))


async def new_admin(servers: list[str], options: KafkaOptions) -> Any:
    """A started admin client."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=servers, request_timeout_ms=ms(options.request_timeout)
    )
    await _start(admin, "admin", servers, options)
    return admin


async def new_producer(servers: list[str], options: KafkaOptions, max_bytes: int) -> Any:
    """A started producer: acks from every in-sync replica, no idempotence (Tansu has no
    InitProducerId), batches sent as built (``send_batch``)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=servers,
        acks="all",
        enable_idempotence=False,
        linger_ms=0,
        max_request_size=max_bytes,
        request_timeout_ms=ms(options.request_timeout),
    )
    await _start(producer, "producer", servers, options)
    return producer


async def new_consumer(servers: list[str], options: KafkaOptions, *, max_wait: float) -> Any:
    """A started consumer without a group (assign + seek only)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=ms(max_wait),
        request_timeout_ms=ms(options.request_timeout),
        max_partition_fetch_bytes=max(options.max_batch_bytes, 1024 * 1024) * 2,
    )
    await _start(consumer, "consumer", servers, options)
    return consumer
