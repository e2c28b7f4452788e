"""The asynchronous calls walsvc makes of pulsar-client, each made safe for a loop that
closes before its answer comes.

``pulsar.asyncio`` settles each call's future from a client thread with
``loop.call_soon_threadsafe``, which raises once the loop is closed; the exception then
leaves a C++ callback and the process aborts ("terminate called without an active
exception", SIGABRT). That happens whenever ``asyncio.run`` ends with a pulsar:// WAL
still open and a call in flight: measured with Pulsar Lite, a script that left a WAL
open while a read started aborted in 9 runs of 12 (an unsubscribe answered after the
loop closed), and 1 in 8 with no read. So walsvc makes each call of the C++ client
itself, through ``call_async`` (whose callback drops an answer that comes too late),
and keeps ``pulsar.asyncio``'s objects only as holders of the C++ ones: producers,
consumers and readers are created, asked and closed here; ``_sender`` and ``_writer``
send through ``call_async`` and ``GroupAcks``. Readers are the exception: their calls
are the synchronous ones, in threads (``call_in_thread``), since their asynchronous
ones corrupted the client's heap (see ``Reader``).
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias, final

import pulsar
import pulsar.asyncio as pulsar_asyncio
from pulsar import _pulsar

from ._client import Client, call_async, call_in_thread
from ._clients import retire

__all__ = (
    "NATIVE",
    "Reader",
    "Resource",
    "close",
    "create_producer",
    "holding",
    "last_message_id",
    "subscribe",
    "topic_partitions",
    "unsubscribe",
)


def holding(raw: Any) -> pulsar.schema.BytesSchema:
    """A raw-bytes schema that holds the C++ client ``raw``, for one producer, consumer or
    reader made by it. ``pulsar.asyncio`` keeps the schema beside the C++ object, set
    after it, so a dealloc frees the object first: the client outlives every object it
    made, whatever order its owners go in (a ``PulsarBackend`` frees its ``client``
    before its producer). Freed first, the client would leave the last reference to its
    I/O executor to the object, whose destructor would tear the executor's
    ``io_context`` down on the freeing thread: a SIGSEGV in ``epoll_reactor::shutdown``
    from ``~HandlerBase`` was seen so, in a producer freed after its client. (Within a
    cycle the collector may clear the schema first; a WAL's close drops its objects
    itself, see ``PulsarBackend.aclose``; the client lives on, ``_clients``.)"""
    schema = pulsar.schema.BytesSchema()
    schema.attach_client(raw)
    return schema


@final
class Reader:
    """A C++ reader (``_reader``) and the schema that holds its client (``_schema``, see
    ``holding``), as ``pulsar.asyncio``'s producers and consumers hold theirs: the
    reader is freed first. Its calls are synchronous, made in threads
    (``call_in_thread``): never ``pulsar.asyncio.Reader``'s asynchronous ones."""

    __slots__ = ("_reader", "_schema")

    def __init__(self, reader: Any, schema: pulsar.schema.BytesSchema) -> None:
        self._reader = reader
        self._schema = schema

    def topic(self) -> str:
        """The topic read."""
        return str(self._reader.topic())


#: A producer or consumer of ``pulsar.asyncio``, or a reader.
Resource: TypeAlias = pulsar_asyncio.Producer | pulsar_asyncio.Consumer | Reader
#: Their classes.
NATIVE: Final = (pulsar_asyncio.Producer, pulsar_asyncio.Consumer, Reader)


async def close(resource: Resource) -> None:
    """Close a producer, consumer or reader; it is then kept alive a while (``retire``:
    a timer of it may still be queued in its client's I/O thread)."""
    retire(resource)
    if isinstance(resource, pulsar_asyncio.Producer):
        await call_async(resource._producer.close_async)
    elif isinstance(resource, pulsar_asyncio.Consumer):
        await call_async(resource._consumer.close_async)
    else:
        await call_in_thread(resource._reader.close)


async def unsubscribe(consumer: pulsar_asyncio.Consumer) -> None:
    """Delete ``consumer``'s subscription (and close the consumer, kept alive a while as
    by ``close``)."""
    retire(consumer)
    await call_async(consumer._consumer.unsubscribe_async)


async def last_message_id(consumer: pulsar_asyncio.Consumer) -> Any:
    """The id of the last message of ``consumer``'s topic (a C++ ``MessageId``)."""
    return await call_async(consumer._consumer.get_last_message_id_async)


async def topic_partitions(client: Client, topic: str) -> list[str]:
    """The partitions of ``topic`` (the topic itself if it has none)."""
    partitions: list[str] = await call_async(
        lambda done: client.raw.get_topic_partitions_async(topic, done)
    )
    return partitions


async def create_producer(
    client: Client,
    topic: str,
    *,
    send_timeout_millis: int,
    batching_enabled: bool,
    batching_max_messages: int = 1000,
    batching_max_publish_delay_ms: int = 10,
    max_pending_messages: int = 1000,
    block_if_queue_full: bool = False,
    access_mode: Any = pulsar_asyncio.ProducerAccessMode.Shared,
) -> pulsar_asyncio.Producer:
    """A producer of raw bytes on ``topic`` (the settings are pulsar-client's, with its
    defaults)."""
    raw = client.raw
    schema = holding(raw)
    conf = _pulsar.ProducerConfiguration()
    conf.schema(schema.schema_info())
    conf.send_timeout_millis(send_timeout_millis)
    conf.batching_enabled(batching_enabled)
    conf.batching_max_messages(batching_max_messages)
    conf.batching_max_publish_delay_ms(batching_max_publish_delay_ms)
    conf.max_pending_messages(max_pending_messages)
    conf.block_if_queue_full(block_if_queue_full)
    conf.access_mode(access_mode)
    made = await call_async(lambda done: raw.create_producer_async(topic, conf, done))
    return pulsar_asyncio.Producer(made, schema)


async def subscribe(
    client: Client, topic: str, name: str, *, receiver_queue_size: int
) -> pulsar_asyncio.Consumer:
    """An exclusive consumer of raw bytes on ``topic`` under subscription ``name``."""
    raw = client.raw
    schema = holding(raw)
    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(pulsar.ConsumerType.Exclusive)
    conf.receiver_queue_size(receiver_queue_size)
    conf.schema(schema.schema_info())
    made = await call_async(lambda done: raw.subscribe_async(topic, name, conf, done))
    return pulsar_asyncio.Consumer(made, schema)
