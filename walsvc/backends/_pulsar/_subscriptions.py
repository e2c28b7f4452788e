"""Durable subscriptions of a ``pulsar://`` pchannel: a keyed topic, read compacted.

Where a checkpoint lives. The checkpoints of pchannel P are messages of the topic
``<topic_prefix>_sub.<P>`` (a pchannel name starts with a letter or a digit, so it never
collides with a pchannel's topic): partition key = the subscription name (ASCII), data =
the checkpoint encoded as a ``file://`` checkpoint file is (magic, CRC32C, version,
``Checkpoint.marshal()`` text and the subscription's scope); a deleted one is an empty
message with the property ``walsvc.deleted``. The newest message of a key wins; ``load``
and ``names`` read the topic up to its end as of the call. This topic is the only
authority.

Reading. The end is found as the backend's tail tracker finds it (a throwaway consumer's
``get_last_message_id``; Pulsar Lite answers ``UnknownError`` for a topic without
entries, which means "empty"); the topic is then read with a reader opened with
``is_read_compacted=True`` until ``has_message_available`` says no more (a reader that
delivers nothing, or does not answer, for ``STALL`` seconds is replaced by one that
resumes after the last message read, as the log's readers are). Apache Pulsar
serves such a reader the compacted view once the topic is compacted (set a compaction
threshold on the namespace: an empty message is what its compaction drops as a deleted
key). Pulsar Lite accepts the flag and delivers every message (it does not compact), so
there the topic grows by one message per save. Each store remembers what it read
(position and newest value per key) and later calls read only what was appended since.
Re-delivered messages (ids not above the previous one: Pulsar Lite re-sends a batch
entry now and then) are dropped.

Errors. Every call is bounded by ``operation_timeout`` (``BackendUnavailable``); a
message whose key is not a subscription name or whose value fails its checks raises
``CorruptRecord`` (the value only when it is loaded); after ``aclose`` every method
raises ``WALClosed``.

Claims stay in the process (``SubscriptionStore.claim``). The Pulsar way to claim across
processes is an Exclusive consumer on a per-name subscription, but ``claim`` is
synchronous (``WAL.read`` calls it) and creating a consumer is a broker round trip that
would block the event loop for up to ``operation_timeout``. Pulsar Lite also refuses a
second Exclusive consumer only by dropping the connection (the client retries until its
operation timeout, then raises ``Timeout``), which would disturb every other producer and
consumer sharing that connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Final, final

from pulsar import _pulsar

from walsvc.backends._subscriptions import (
    StoredSubscription,
    SubscriptionStore,
    check_subscription_name,
    decode_subscription,
    encode_subscription,
)
from walsvc.core._errors import BackendUnavailable, CorruptRecord, InvalidArgument, WALClosed

from ._calls import close, create_producer
from ._client import PULSAR_ERRORS, Client, Options, call_async, translate
from ._ids import PulsarMessageId
from ._log import EARLIEST, STALL, STOP_WITHIN, close_quietly, create_reader, last_entry

if TYPE_CHECKING:
    import pulsar.asyncio as pulsar_asyncio

    from ._reader import OrderedReader

__all__ = ("DELETED", "PulsarSubscriptionStore", "subscriptions_topic")

#: The property marking an (empty) message as the deletion of its key's checkpoint.
DELETED: Final = "walsvc.deleted"


def subscriptions_topic(options: Options, pchannel: str) -> str:
    """The topic holding the checkpoints of ``pchannel``."""
    return f"{options.topic_prefix}_sub.{pchannel}"


@final
class PulsarSubscriptionStore(SubscriptionStore):
    """The subscriptions of one ``pulsar://`` pchannel; see the module docstring.

    Uses the backend's client (which it does not close); its producer starts on the first
    save or delete (also on a read-only WAL) and stops with ``aclose``.
    """

    __slots__ = (
        "_busy",
        "_client",
        "_closed",
        "_latest",
        "_producer",
        "_scanned",
        "_timeout",
        "stalls",
        "topic",
    )

    def __init__(self, client: Client, location: str, options: Options, pchannel: str) -> None:
        #: The topic holding the checkpoints.
        self.topic = subscriptions_topic(options, pchannel)
        super().__init__(("pulsar", location, self.topic))
        self._client = client
        self._timeout = options.operation_timeout
        self._producer: pulsar_asyncio.Producer | None = None
        self._busy = asyncio.Lock()
        self._closed = False
        #: The last message read; the next read starts after it.
        self._scanned: PulsarMessageId | None = None
        #: Per name, the newest message read: (its id, its data, or None if deleted).
        self._latest: dict[str, tuple[PulsarMessageId, bytes | None]] = {}
        #: How many readers were replaced because they stopped delivering.
        self.stalls = 0

    async def aclose(self) -> None:
        """Stop the store's producer; later calls raise ``WALClosed``. Idempotent."""
        self._closed = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WITHIN), self._busy:
                pass  # after the call in flight, if it ends soon
        producer, self._producer = self._producer, None
        if producer is not None:
            await close_quietly(producer, STOP_WITHIN)

    # -- SubscriptionStore --------------------------------------------------------------

    async def _load(self, name: str) -> StoredSubscription | None:
        await self._catch_up()
        found = self._latest.get(name)
        if found is None:
            return None
        message_id, value = found
        if value is None:
            return None
        return decode_subscription(
            f"{self.topic}@{message_id.marshal()} (subscription {name!r})", value
        )

    async def _save(self, name: str, stored: StoredSubscription) -> None:
        await self._produce(name, encode_subscription(stored), {})

    async def _delete(self, name: str) -> None:
        await self._produce(name, b"", {DELETED: "1"})

    async def _names(self) -> list[str]:
        await self._catch_up()
        return [name for name, (_, value) in self._latest.items() if value is not None]

    # -- writing ------------------------------------------------------------------------

    async def _produce(self, name: str, value: bytes, properties: dict[str, str]) -> None:
        async with self._busy:
            self._check_open()
            try:
                async with asyncio.timeout(self._timeout):
                    producer = await self._started_producer()
                    await _send(producer, value, properties, name)
            except TimeoutError:
                await self._drop_if_disconnected()
                raise BackendUnavailable(
                    f"writing the checkpoint of subscription {name!r} to {self.topic} took"
                    f" longer than {self._timeout} s"
                ) from None
            except PULSAR_ERRORS as exc:
                await self._drop_if_disconnected()
                raise translate(
                    exc, f"cannot write the checkpoint of subscription {name!r} to {self.topic}"
                ) from exc

    async def _drop_if_disconnected(self) -> None:
        """After a failed write: close a producer that is not connected, so that the next
        write makes a new one. pulsar-client 3.12 may have given up on it for good (see
        ``_producers``); one that was only reconnecting costs a creation."""
        producer = self._producer
        if producer is not None and not producer.is_connected():
            self._producer = None
            await close_quietly(producer, STOP_WITHIN)

    async def _started_producer(self) -> pulsar_asyncio.Producer:
        if self._producer is None:
            creating = create_producer(
                self._client,
                self.topic,
                send_timeout_millis=max(1, int(self._timeout * 1000)),
                batching_enabled=False,
            )
            self._producer = await self._client.creations.make(creating, close)
        return self._producer

    # -- reading ------------------------------------------------------------------------

    async def _catch_up(self) -> None:
        """Read what was appended to the topic since the last read, up to its end."""
        async with self._busy:
            self._check_open()
            try:
                async with asyncio.timeout(self._timeout):
                    await self._read_new()
            except TimeoutError:
                raise BackendUnavailable(
                    f"reading the subscriptions in {self.topic} took longer than {self._timeout} s"
                ) from None
            except PULSAR_ERRORS as exc:
                raise translate(exc, f"cannot read the subscriptions in {self.topic}") from exc

    async def _read_new(self) -> None:
        end = await last_entry(self._client, self.topic, self._timeout)
        if end is None:
            return  # empty (Pulsar Lite cannot answer has_message_available on it)
        while self._scanned is None or self._scanned < end:
            start = EARLIEST if self._scanned is None else self._scanned
            reader = await create_reader(
                self._client, self.topic, start, inclusive=False, compacted=True
            )
            try:
                if await self._read_to_the_end(reader):
                    return
            finally:
                await close_quietly(reader, self._timeout)
            self.stalls += 1  # a new reader resumes after the last message noted

    async def _read_to_the_end(self, reader: OrderedReader) -> bool:
        """Note what ``reader`` delivers until it says nothing more is available: True.
        False if it delivers nothing, or does not answer, for ``STALL`` seconds (Pulsar
        Lite was seen to stop serving a reader that still had entries to send)."""
        while True:
            try:
                async with asyncio.timeout(STALL):
                    if not await reader.has_message_available():
                        return True
                    batch = await reader.next_batch()
            except TimeoutError:
                return False
            for message_id, message in batch:
                self._note(message_id, message)

    def _note(self, message_id: PulsarMessageId, message: Any) -> None:
        """Take in one record (a message of the client's C reader) stored at
        ``message_id``."""
        if self._scanned is not None and message_id <= self._scanned:
            return  # delivered again
        key = message.partition_key()
        try:
            name = check_subscription_name(key)
        except (InvalidArgument, TypeError) as exc:
            raise CorruptRecord(
                f"{self.topic}@{message_id.marshal()}: not a walsvc subscription record"
                f" (key {key!r})"
            ) from exc
        deleted = DELETED in message.properties()
        self._latest[name] = (message_id, None if deleted else message.data())
        self._scanned = message_id

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosed(f"the subscriptions in {self.topic} are closed")


async def _send(
    producer: pulsar_asyncio.Producer, value: bytes, properties: dict[str, str], key: str
) -> None:
    """Send one record with ``properties`` and partition key ``key``; return once stored."""
    builder = _pulsar.MessageBuilder()
    builder.content(value)
    for name, text in properties.items():
        builder.property(name, text)
    builder.partition_key(key)
    inner = producer._producer
    await call_async(lambda done: inner.send_async(builder.build(), done))
