"""Fetching one partition from an offset by raw Fetch requests, one request ahead.

``PartitionFetcher`` is what a scanner reads through instead of an ``AIOKafkaConsumer``:
it sends aiokafka's ``FetchRequest`` on an ``AIOKafkaClient`` of its own and hands the
response's bytes to ``_batches.walk``, so no ``ConsumerRecord`` is built per record.
As soon as a response has been walked, the request for what follows it is sent, so the
broker prepares the next response while the caller works through this one (aiokafka's
consumer prefetches the same way).

Errors: a transport failure or a retriable broker error (a leader change, an unknown
topic while metadata catches up) is retried with a short backoff, refreshing metadata
where the error says it is stale, for at most ``request_timeout`` from the first failure;
then ``BackendUnavailable``. An offset out of range is ``WALTruncated``; any other error
code ``BackendUnavailable`` naming it. ``aclose`` cancels the fetch in flight: a ``next``
waiting for it raises ``WALClosed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, OffsetOutOfRangeError, for_code
from aiokafka.protocol.fetch import FetchRequest

from walsvc.core._errors import BackendUnavailable, WALClosed, WALTruncated

from ._batches import Walked, walk
from ._client import ms, start_client, stop_quietly
from ._options import KafkaOptions

__all__ = ("PartitionFetcher",)

_BACKOFF: Final = 0.1
_READ_UNCOMMITTED: Final = 0
#: The most one fetch asks for when a single batch does not fit the usual size (brokers
#: before KIP-74 return nothing then): the topic's largest batch, with room to spare.
_MAX_FETCH_BYTES: Final = 64 * 1024 * 1024


class PartitionFetcher:
    """Records of one topic partition from ``position`` on, in offset order.

    ``next`` waits up to ``max_wait`` (the broker's long poll) and returns what arrived:
    possibly nothing. ``position`` is the offset the next ``next`` starts at.
    """

    __slots__ = (
        "_client",
        "_closed",
        "_fetch_bytes",
        "_max_wait_ms",
        "_options",
        "_pending",
        "_servers",
        "position",
        "tp",
    )

    def __init__(
        self,
        servers: list[str],
        options: KafkaOptions,
        tp: TopicPartition,
        position: int,
        *,
        max_wait: float,
    ) -> None:
        self._servers = servers
        self._options = options
        self.tp = tp
        self.position = position
        self._max_wait_ms = ms(max_wait)
        self._fetch_bytes = max(options.max_batch_bytes, 1024 * 1024) * 2
        self._client: Any = None
        self._pending: asyncio.Task[tuple[int, bytes]] | None = None
        self._closed = False

    async def start(self) -> None:
        """Connect and learn the partition's leader, retried until ``connect_timeout``
        (then ``BackendUnavailable``)."""
        options = self._options

        async def bootstrap(client: Any) -> None:
            await client.bootstrap()
            await client.add_topic(self.tp.topic)

        self._client = await start_client(
            lambda: AIOKafkaClient(
                bootstrap_servers=self._servers, request_timeout_ms=ms(options.request_timeout)
            ),
            "fetcher",
            self._servers,
            options,
            bootstrap,
        )
        if self._closed:  # closed while starting
            client, self._client = self._client, None
            await stop_quietly(client)

    async def next(self) -> list[Walked]:
        """The records from ``position`` that the next response holds (or none after the
        broker's long poll); ``position`` moves past them. Raises ``WALClosed`` once the
        fetcher is closed, also when it is closed while this call waits."""
        if self._closed:
            raise WALClosed(f"the fetcher of {self.tp.topic} is closed")
        fetch_offset = self.position
        pending = self._pending
        if pending is None:  # aclose cancels the fetch in flight through _pending
            pending = self._pending = asyncio.ensure_future(self._fetch(fetch_offset))
        try:
            fetch_bytes, data = await pending
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and (task is None or not task.cancelling()):
                raise WALClosed(f"the fetcher of {self.tp.topic} is closed") from None
            raise
        finally:
            if self._pending is pending:
                self._pending = None
        records, after = walk(data, fetch_offset)
        if after == fetch_offset and data:
            # One batch larger than the fetch size, from a broker that does not send it
            # whole anyway (KIP-74): ask for more, up to _MAX_FETCH_BYTES.
            if fetch_bytes >= _MAX_FETCH_BYTES:
                raise BackendUnavailable(
                    f"the record batch at offset {fetch_offset} of {self.tp.topic} is larger"
                    f" than {_MAX_FETCH_BYTES} bytes"
                )
            self._fetch_bytes = min(fetch_bytes * 2, _MAX_FETCH_BYTES)
        self.position = after
        if records:
            self._pending = asyncio.ensure_future(self._fetch(after))
        return records

    async def read_at(self, offset: int) -> tuple[list[Walked], int]:
        """The records one fetch from ``offset`` returns (nothing is prefetched after
        them), and the offset after them: for reads that jump around (a search), not
        for a scanner. A batch larger than the fetch size is fetched again, larger.
        Raises as ``next`` does."""
        if self._closed:
            raise WALClosed(f"the fetcher of {self.tp.topic} is closed")
        while True:
            fetch_bytes, data = await self._fetch(offset)
            records, after = walk(data, offset)
            if after != offset or not data:
                return records, after
            if fetch_bytes >= _MAX_FETCH_BYTES:
                raise BackendUnavailable(
                    f"the record batch at offset {offset} of {self.tp.topic} is larger"
                    f" than {_MAX_FETCH_BYTES} bytes"
                )
            self._fetch_bytes = min(fetch_bytes * 2, _MAX_FETCH_BYTES)

    async def _fetch(self, offset: int) -> tuple[int, bytes]:
        """(fetch size, record bytes) of one successful fetch at ``offset``, retrying
        what is retriable (see the module docstring)."""
        client, tp = self._client, self.tp
        failing_since: float | None = None
        while True:
            if self._closed:
                raise WALClosed(f"the fetcher of {tp.topic} is closed")
            fetch_bytes = self._fetch_bytes
            try:
                node = client.cluster.leader_for_partition(tp)
                if node is None or node < 0:
                    await client.force_metadata_update()
                    node = client.cluster.leader_for_partition(tp)
                    if node is None or node < 0:
                        raise KafkaError(f"no leader known for {tp.topic}")
                request = FetchRequest(
                    self._max_wait_ms,
                    1,
                    fetch_bytes,
                    _READ_UNCOMMITTED,
                    [(tp.topic, [(tp.partition, offset, fetch_bytes)])],
                )
                response = await client.send(node, request)
                error, data = _partition_data(response, tp)
                if error is OffsetOutOfRangeError:
                    raise WALTruncated(f"kafka WAL {tp.topic}: position {offset} was truncated")
                if error is None:
                    return fetch_bytes, data
                if not error.retriable:
                    raise BackendUnavailable(f"fetching {tp.topic} failed: {error.__name__}")
                if error.invalid_metadata:
                    client.force_metadata_update()
                failure: BaseException = error()
            except KafkaError as exc:
                failure = exc
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
            elif now - failing_since > self._options.request_timeout:
                raise BackendUnavailable(
                    f"fetching {tp.topic} failed for {self._options.request_timeout} s: {failure!r}"
                ) from failure
            await asyncio.sleep(_BACKOFF)

    async def aclose(self) -> None:
        """Drop the request in flight and close the connections (within
        ``_client.STOP_WITHIN``). Idempotent."""
        self._closed = True
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        client, self._client = self._client, None
        if client is not None:
            await stop_quietly(client)


def _partition_data(response: Any, tp: TopicPartition) -> tuple[Any, bytes]:
    """(error class or None, record bytes) of ``tp`` in a fetch response."""
    for topic, partitions in response.topics:
        if topic != tp.topic:
            continue
        for partition, error_code, _highwater, *rest in partitions:
            if partition == tp.partition:
                if error_code:
                    return for_code(error_code), b""
                return None, bytes(rest[-1] or b"")
    return for_code(3), b""  # UNKNOWN_TOPIC_OR_PARTITION: not in the response
