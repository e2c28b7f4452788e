"""Durable subscriptions of a ``kafka://`` pchannel: a compacted topic, mirrored as
Kafka consumer-group offsets.

Where a checkpoint lives. The checkpoints of pchannel P are records of the one-partition
topic ``<topic_prefix>_sub.<P>`` (``cleanup.policy=compact``): key = the subscription
name (ASCII), value = the checkpoint encoded as a ``file://`` checkpoint file is (magic,
CRC32C, version, ``Checkpoint.marshal()`` text and the subscription's scope), a tombstone
(null value) for a deleted one. The newest record of a key wins; ``load`` and ``names``
read the topic to its end. This topic is the only authority.

The mirror. Every save also commits, for the consumer group ``<topic_prefix>_sub.<P>.<name>``,
the checkpoint's last-confirmed offset (0 when it has none) on partition 0 of the WAL's
topic, with the base64 of the encoded checkpoint as the commit metadata; a delete
removes the group (DeleteGroups). So ``kafka-consumer-groups --describe`` shows each
subscription's lag (measured from its last-confirmed id, which is at or before the last
acknowledged message). The commit is a simple one: generation -1 and an empty member
id, no JoinGroup, no rebalance (Kafka allows that for groups without members).

Why not the group alone (the first design): Tansu 0.6 accepts the commit but drops its
metadata (OffsetFetch returns ``metadata=''``), so the checkpoint's timetick could not
be read back, and group names cannot tell P = "a.b", name "c" from P = "a", name "b.c".

Order and failures. A save writes the record, then commits the group; a delete writes
the tombstone, then deletes the group. A failure in between raises
``BackendUnavailable`` with the topic already updated (the authority: the save or the
delete happened; the mirror catches up on the next save or delete). Every broker call is
bounded by ``request_timeout`` (client starts by ``connect_timeout``).

Names. A pchannel name starts with a letter or a digit, so the ``_sub.`` topics and
groups never collide with a pchannel's topic.

Claims stay in the process (``SubscriptionStore.claim``): Kafka offers no lock that is
dropped when its holder dies without joining the group, which this store never does.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Final, final

from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaError
from aiokafka.protocol.admin import DeleteGroupsRequest
from aiokafka.protocol.commit import OffsetCommitRequest

from walsvc.backends._subscriptions import (
    StoredSubscription,
    SubscriptionStore,
    check_subscription_name,
    decode_subscription,
    encode_subscription,
)
from walsvc.core._errors import BackendUnavailable, CorruptRecord, InvalidArgument, WALClosed

from ._client import new_admin, new_producer, stop_quietly
from ._ids import KafkaMessageId
from ._log import LogReader
from ._options import KafkaOptions
from ._topic import check_partitions

__all__ = ("KafkaSubscriptionStore", "group_of", "subscriptions_topic")

_TOPIC_EXISTS: Final = 36
_GROUP_ID_NOT_FOUND: Final = 69
_NON_EMPTY_GROUP: Final = 68
_PRODUCER_BYTES: Final = 64 * 1024
_RETRY_PAUSE: Final = 0.05


def subscriptions_topic(options: KafkaOptions, pchannel: str) -> str:
    """The compacted topic holding the checkpoints of ``pchannel``."""
    return f"{options.topic_prefix}_sub.{pchannel}"


def group_of(options: KafkaOptions, pchannel: str, name: str) -> str:
    """The consumer group mirroring subscription ``name`` of ``pchannel``."""
    return f"{options.topic_prefix}_sub.{pchannel}.{name}"


@final
class KafkaSubscriptionStore(SubscriptionStore):
    """The subscriptions of one ``kafka://`` pchannel; see the module docstring.

    Clients start on first use (also on a read-only WAL) and stop with ``aclose``; after
    it every method raises ``WALClosed``.
    """

    __slots__ = (
        "_admin",
        "_closed",
        "_options",
        "_pchannel",
        "_producer",
        "_reader",
        "_servers",
        "_start_lock",
        "_topic_ready",
        "_wal_topic",
        "topic",
    )

    def __init__(
        self, servers: list[str], options: KafkaOptions, pchannel: str, wal_topic: str
    ) -> None:
        self.topic = subscriptions_topic(options, pchannel)
        super().__init__(("kafka", ",".join(servers), self.topic))
        self._servers = servers
        self._options = options
        self._pchannel = pchannel
        self._wal_topic = wal_topic
        self._reader = LogReader(servers, self.topic, options)
        self._admin: Any = None
        self._producer: Any = None
        self._topic_ready = False
        self._closed = False
        self._start_lock = asyncio.Lock()

    async def aclose(self) -> None:
        """Stop the store's clients; later calls raise ``WALClosed``. Idempotent."""
        self._closed = True
        admin, self._admin = self._admin, None
        producer, self._producer = self._producer, None
        await asyncio.gather(
            self._reader.aclose(),
            *(stop_quietly(client) for client in (admin, producer) if client is not None),
        )

    # -- SubscriptionStore --------------------------------------------------------------

    async def _load(self, name: str) -> StoredSubscription | None:
        found: Any = None
        for record in await self._records():
            if self._name_of(record) == name:
                found = record
        if found is None or found.value is None:
            return None
        where = f"{self.topic}@{found.offset} (subscription {name!r})"
        return decode_subscription(where, found.value)

    async def _save(self, name: str, stored: StoredSubscription) -> None:
        value = encode_subscription(stored)
        await self._produce(name, value)
        lc = stored.checkpoint.last_confirmed_id
        offset = lc.seq if isinstance(lc, KafkaMessageId) else 0
        await self._commit_group(name, offset, base64.b64encode(value).decode("ascii"))

    async def _delete(self, name: str) -> None:
        await self._produce(name, None)
        await self._delete_group(name)

    async def _names(self) -> list[str]:
        latest: dict[str, bool] = {}
        for record in await self._records():
            latest[self._name_of(record)] = record.value is not None
        return [name for name, alive in latest.items() if alive]

    # -- the topic ----------------------------------------------------------------------

    def _name_of(self, record: Any) -> str:
        key = record.key
        try:
            return check_subscription_name(key.decode("ascii"))
        except (AttributeError, UnicodeDecodeError, InvalidArgument) as exc:
            raise CorruptRecord(
                f"{self.topic}@{record.offset}: not a walsvc subscription record (key {key!r})"
            ) from exc

    async def _records(self) -> list[Any]:
        """Every retained record of the topic, up to its end as of this call."""
        self._check_open()
        await self._ensure_topic()
        first, end = await self._reader.bounds()
        return await self._reader.read(first, end)

    async def _produce(self, name: str, value: bytes | None) -> None:
        await self._ensure_topic()
        producer = await self._client("producer")
        try:
            async with asyncio.timeout(self._options.request_timeout):
                await producer.send_and_wait(
                    self.topic, value, key=name.encode("ascii"), partition=0
                )
        except (TimeoutError, KafkaError) as exc:
            raise BackendUnavailable(
                f"cannot write the checkpoint of subscription {name!r} to {self.topic}"
                f" ({exc!r}); the producer may still deliver it once the broker answers"
            ) from exc

    async def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        admin = await self._client("admin")
        try:
            async with asyncio.timeout(self._options.request_timeout):
                for configs in ({"cleanup.policy": "compact"}, {}):
                    response = await admin.create_topics(
                        [NewTopic(self.topic, 1, 1, topic_configs=configs)]
                    )
                    code, message = response.topic_errors[0][1:3]
                    if code in (0, _TOPIC_EXISTS):
                        break
                else:
                    raise BackendUnavailable(
                        f"cannot create Kafka topic {self.topic}: {code} {message}"
                    )
                await check_partitions(admin, self.topic)
        except (TimeoutError, KafkaError) as exc:
            raise BackendUnavailable(f"cannot create Kafka topic {self.topic}: {exc!r}") from exc
        self._topic_ready = True

    # -- the consumer-group mirror ------------------------------------------------------

    async def _commit_group(self, name: str, offset: int, metadata: str) -> None:
        group = group_of(self._options, self._pchannel, name)
        request = OffsetCommitRequest(
            group,
            OffsetCommitRequest.DEFAULT_GENERATION_ID,  # -1: no generation, no member
            "",
            OffsetCommitRequest.DEFAULT_RETENTION_TIME,
            [(self._wal_topic, [(0, offset, metadata)])],
        )
        response = await self._send_to_coordinator(group, request, "commit the offset of")
        codes = [code for _, partitions in response.topics for _, code in partitions]
        if any(codes):
            raise BackendUnavailable(
                f"the broker refused to commit offset {offset} for consumer group {group}"
                f" (error codes {codes})"
            )

    async def _delete_group(self, name: str) -> None:
        group = group_of(self._options, self._pchannel, name)
        response = await self._send_to_coordinator(group, DeleteGroupsRequest([group]), "delete")
        codes = [code for _, code in response.results]
        if any(code not in (0, _GROUP_ID_NOT_FOUND) for code in codes):
            hint = " (a client joined it)" if _NON_EMPTY_GROUP in codes else ""
            raise BackendUnavailable(
                f"the broker did not delete consumer group {group}: error codes {codes}{hint}"
            )

    async def _send_to_coordinator(self, group: str, request: Any, what: str) -> Any:
        """Send ``request`` to ``group``'s coordinator, again after a lost connection or
        another retriable error (both requests are idempotent) until ``request_timeout``.

        Tansu 0.6 closes the connection on the first OffsetCommit for a group it deleted
        (DeleteGroups); the next one succeeds."""
        admin = await self._client("admin")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.request_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    node = await admin.find_coordinator(group)
                    # aiokafka 0.14's admin client has no public call for these requests.
                    return await admin._send_request(request, node)
            except (TimeoutError, KafkaError) as exc:
                retriable = isinstance(exc, KafkaError) and exc.retriable
                if not retriable or loop.time() + _RETRY_PAUSE >= deadline:
                    raise BackendUnavailable(
                        f"cannot {what} consumer group {group}: {exc!r}"
                    ) from exc
            await asyncio.sleep(_RETRY_PAUSE)

    # -- clients ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosed(f"the subscriptions of kafka WAL {self._wal_topic} are closed")

    async def _client(self, kind: str) -> Any:
        async with self._start_lock:
            self._check_open()
            if kind == "admin":
                if self._admin is None:
                    self._admin = await new_admin(self._servers, self._options)
                return self._admin
            if self._producer is None:
                self._producer = await new_producer(self._servers, self._options, _PRODUCER_BYTES)
            return self._producer
