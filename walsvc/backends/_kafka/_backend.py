"""``kafka://host:port[,host:port...]``: one pchannel per one-partition Kafka topic.

Options (keywords of ``walsvc.open_wal``):

- ``topic_prefix`` (default ``"walsvc."``): the topic of pchannel P is prefix + P.
- ``connect_timeout`` (seconds, default 10): connecting is retried until it has passed
  (a broker that is down or paused at the open may come back meanwhile); an unreachable
  broker raises ``BackendUnavailable`` after it.
- ``request_timeout`` (seconds, default 30): the bound on every request and read.
- ``close_timeout`` (seconds, default 5): how long ``aclose`` (or the close started by
  ``begin_close``) lets queued appends finish; then the batch in flight fails with
  ``AppendOutcomeUnknown``, the rest with ``WALClosed``, and the clients are stopped
  within about one second more. ``aclose`` never raises.
- ``max_batch_bytes`` (default 1 MiB): appends queued while a batch is in flight are
  sent together, up to this many bytes (one append call is never split, so one call may
  hold at most max(``max_batch_bytes``, the WAL's ``max_message_size``) bytes, else
  ``MessageTooLarge``; the topic's ``max.message.bytes`` is sized to hold that).

Message ids are offsets (``KafkaMessageId``). Fencing is an offset chain (``_writer``):
a read-write open appends a barrier at offset B and takes term B + 1.

Durable subscriptions live in the topic ``<topic_prefix>_sub.<P>``, mirrored as consumer
groups ``<topic_prefix>_sub.<P>.<name>`` (``_subscriptions``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, final

from aiokafka.errors import KafkaError

from walsvc.backends._base import Backend, BackendScanner
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import BackendUnavailable, InvalidArgument, WALClosed, WALReadOnly
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId

from ._batch import append_barrier
from ._client import new_admin, new_producer, stop_quietly
from ._ids import KafkaMessageId
from ._log import LogReader
from ._options import KafkaOptions, parse_location, parse_options
from ._records import Mark
from ._scanner import KafkaScanner
from ._seek import start_at_timetick
from ._subscriptions import KafkaSubscriptionStore
from ._topic import check_partitions, ensure_topic, topic_exists
from ._writer import OffsetChainWriter

__all__ = ("KafkaBackend",)

_PRODUCER_SLACK = 64 * 1024


@final
class KafkaBackend(Backend):
    """One pchannel of a Kafka cluster, opened read-only or read-write."""

    __slots__ = (
        "_closed",
        "_scanners",
        "_subscriptions",
        "_writer",
        "options",
        "pchannel",
        "read_only",
        "reader",
        "servers",
        "term",
        "topic",
    )

    scheme = "kafka"
    message_id_class = KafkaMessageId

    def __init__(
        self,
        servers: list[str],
        options: KafkaOptions,
        pchannel: str,
        reader: LogReader,
        writer: OffsetChainWriter | None,
    ) -> None:
        self.servers = servers
        self.options = options
        self.pchannel = pchannel
        self.topic = reader.topic
        self.reader = reader
        self._writer = writer
        self.read_only = writer is None
        self.term = 0 if writer is None else writer.barrier + 1
        self._closed = False
        self._scanners: set[KafkaScanner] = set()
        self._subscriptions: KafkaSubscriptionStore | None = None

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> KafkaBackend:
        parsed = parse_options(options)
        servers = parse_location(location)
        topic = parsed.topic_prefix + pchannel
        # The largest batch the writer sends: one append call is never split.
        call_limit = max(parsed.max_batch_bytes, max_message_size)
        admin = await new_admin(servers, parsed)
        try:
            if read_only:
                if not await topic_exists(admin, topic):
                    raise InvalidArgument(f"no kafka WAL for pchannel {pchannel!r} (topic {topic})")
                await check_partitions(admin, topic)
            else:
                await ensure_topic(admin, topic, call_limit + _PRODUCER_SLACK)
        finally:
            await stop_quietly(admin)
        reader = LogReader(servers, topic, parsed)
        if read_only:
            return cls(servers, parsed, pchannel, reader, None)
        producer = await new_producer(servers, parsed, call_limit + 2 * _PRODUCER_SLACK)
        try:
            barrier = await append_barrier(producer, topic, parsed)
        except BaseException:
            await stop_quietly(producer)
            raise
        return cls(
            servers,
            parsed,
            pchannel,
            reader,
            OffsetChainWriter(producer, reader, parsed, barrier, call_limit),
        )

    def append(self, records: Sequence[bytes]) -> Any:
        writer = self._writer
        if writer is None:
            raise WALReadOnly(f"kafka WAL {self.topic} was opened read-only")
        return writer.submit(records)

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        if self._closed:
            raise WALClosed(f"kafka WAL {self.topic} is closed")
        kind = deliver.kind
        if kind == "all":
            scanner = KafkaScanner(self, None, False, selected)
        elif kind == "latest":
            # The writer knows the end as of its last acknowledged batch without asking;
            # a reader finds the true end by reading when it first fetches.
            writer = self._writer
            start = writer.known_end if writer is not None else None
            scanner = KafkaScanner(self, start, True, selected)
        else:
            seq = _offset_of(deliver.message_id)
            scanner = KafkaScanner(self, seq if kind == "start_from" else seq + 1, False, selected)
        self._scanners.add(scanner)
        return scanner

    def subscriptions(self) -> KafkaSubscriptionStore:
        """The compacted topic ``<topic_prefix>_sub.<P>`` (see ``_subscriptions``); usable
        on a read-only WAL too. Closed with the backend."""
        if self._subscriptions is None:
            self._subscriptions = KafkaSubscriptionStore(
                self.servers, self.options, self.pchannel, self.topic
            )
        return self._subscriptions

    def forget_scanner(self, scanner: KafkaScanner) -> None:
        """Called by a scanner as it closes."""
        self._scanners.discard(scanner)

    async def latest_message_id(self) -> MessageId | None:
        latest, _ = await self.reader.newest()
        return None if latest is None else KafkaMessageId(latest)

    async def last_timetick(self) -> int:
        _, tick = await self.reader.newest()
        return tick

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        """Where a read must start to include every retained message with a timetick at
        or above ``timetick``: found by a binary search over offsets (about log2 N
        fetches, see ``_seek``), so that the read delivers no message below it (but the
        newest message of the log when none is at or above it)."""
        if self._closed:
            raise WALClosed(f"kafka WAL {self.topic} is closed")
        return await start_at_timetick(self.servers, self.options, self.reader, timetick)

    async def truncate(self, message_id: MessageId) -> None:
        """Delete records before ``message_id`` + 1 (Kafka DeleteRecords). A mark with the
        newest id and timetick is appended first, so both survive a truncation of the
        whole log. Brokers without DeleteRecords (Tansu) raise ``BackendUnavailable``."""
        writer = self._writer
        if writer is None:
            raise WALReadOnly(f"kafka WAL {self.topic} was opened read-only")
        offset = _offset_of(message_id)
        await writer.idle()
        latest, tick = await self.reader.newest()
        if latest is None or offset > latest:
            raise InvalidArgument(f"cannot truncate through {message_id!r}: not appended yet")
        await writer.submit((), Mark(latest, tick))
        await _delete_records(self, offset + 1)

    def begin_close(self) -> None:
        """Start closing: appends queued or made from now on have ``close_timeout``
        seconds to finish, and those failing retriably meanwhile fail with ``WALClosed``
        (see ``_writer``). ``aclose`` starts it too; the WAL may call it first so that
        its own waits for appends are bounded the same way. Idempotent."""
        if self._writer is not None:
            self._writer.begin_close()

    async def aclose(self) -> None:
        """Close within ``close_timeout`` plus about one second (see the option): queued
        appends finish or fail (``AppendOutcomeUnknown`` for the batch in flight at the
        deadline, ``WALClosed`` for the rest), scanners end with ``WALClosed``, clients
        stop. Never raises. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.begin_close()
        closing = [scanner.aclose() for scanner in list(self._scanners)]
        if self._subscriptions is not None:
            closing.append(self._subscriptions.aclose())
        if self._writer is not None:
            closing.append(self._writer.aclose())
        await asyncio.gather(*closing, return_exceptions=True)  # none of them raises
        await self.reader.aclose()


async def _delete_records(backend: KafkaBackend, before: int) -> None:
    from aiokafka.admin.records_to_delete import RecordsToDelete

    admin = await new_admin(backend.servers, backend.options)
    try:
        await admin.delete_records(
            {backend.reader.tp: RecordsToDelete(before)},
            timeout_ms=int(backend.options.request_timeout * 1000),
        )
    except KafkaError as exc:
        raise BackendUnavailable(
            f"the broker did not delete records of {backend.topic} before offset {before}"
            f" ({exc!r}); brokers without DeleteRecords (Tansu 0.6 closes the connection)"
            " cannot truncate"
        ) from exc
    finally:
        await stop_quietly(admin)


def _offset_of(message_id: MessageId | None) -> int:
    if not isinstance(message_id, KafkaMessageId):
        raise InvalidArgument(f"{message_id!r} is not a kafka:// message id")
    return message_id.seq
