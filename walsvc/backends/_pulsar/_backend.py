"""``pulsar://HOST:PORT``: one Pulsar topic per pchannel.

Topic ``{topic_prefix}{pchannel}`` (default prefix ``persistent://public/default/walsvc.``).
Each walsvc record is one Pulsar message (payload as data, the rest of the envelope and
the chain properties as message properties, see ``_records``); its id is the Pulsar
MessageId (``PulsarMessageId``).

Fencing: a read-write open creates an ``ExclusiveWithFencing`` producer (Apache Pulsar
then fences the previous writer's producer itself) and appends a *barrier*; the
barrier's position is the writer's term. Pulsar Lite accepts but does not enforce
exclusive producers, so fencing rests on the chain rule that every reader applies: a
writer's group is valid only if it directly follows the writer's own previous message;
a writer that finds a newer barrier in between raises ``WALFenced`` forever.

Durable subscriptions: the topic ``{topic_prefix}_sub.{pchannel}``, one message per save,
keyed by the subscription name (see ``_subscriptions``).

Options (keywords of ``walsvc.open_wal``): ``topic_prefix``; ``connect_timeout`` (seconds,
default 10: reaching the broker and creating the producer); ``operation_timeout``
(seconds, default 30: every operation, and a send's acknowledgement, which is waited for
5 s longer); ``batching_max_messages`` and ``batching_max_publish_delay_ms`` (the
producer's batching); ``close_timeout`` (seconds, default 5): how long ``aclose`` (or the
close ``begin_close`` starts) lets queued appends finish, after which the group in
flight fails with ``AppendOutcomeUnknown`` and the rest with ``WALClosed``; readers,
producer and client then close within about two seconds more (three while a reader or
consumer is still being created: the client waits for it, see ``_creations``).
``aclose`` never raises.

Truncation is not supported (pulsar-client has no admin API, and Pulsar Lite serves none):
``truncate`` raises ``InvalidArgument`` without changing the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, final

import pulsar.asyncio as pulsar_asyncio
from pulsar import _pulsar

from walsvc.backends._base import Backend, BackendScanner
from walsvc.backends._identity import WRITER, this_writer
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import BackendUnavailable, InvalidArgument, WALClosed, WALReadOnly
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId

from ._calls import close, create_producer, topic_partitions
from ._client import PULSAR_ERRORS, Client, Options, call_async, parse_options, translate
from ._clients import lease
from ._ids import PulsarMessageId
from ._log import STOP_WITHIN, TailTracker, close_quietly
from ._producers import ProducerKeeper
from ._records import BARRIER, term_of_barrier
from ._scanner import PulsarScanner
from ._seek import start_at_timetick
from ._subscriptions import PulsarSubscriptionStore
from ._writer import GroupWriter

__all__ = ("PulsarBackend",)


@final
class PulsarBackend(Backend):
    """One pchannel (topic) of a Pulsar cluster, opened read-only or read-write."""

    scheme = "pulsar"
    message_id_class = PulsarMessageId

    def __init__(
        self,
        client: Client,
        location: str,
        topic: str,
        pchannel: str,
        options: Options,
        writer: GroupWriter | None,
    ) -> None:
        self.client = client
        self.location = location
        self.topic = topic
        self.pchannel = pchannel
        self.options = options
        self.read_only = writer is None
        self.term = 0 if writer is None else term_of_barrier(writer.barrier)
        self._writer = writer
        self._tracker = TailTracker(client, topic, options.operation_timeout)
        self._scanners: set[PulsarScanner] = set()
        self._subscriptions: PulsarSubscriptionStore | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> PulsarBackend:
        parsed = parse_options(options)
        topic = f"{parsed.topic_prefix}{pchannel}"
        client = lease(location, parsed)
        producer: pulsar_asyncio.Producer | None = None
        try:
            # Reach the broker now (an unreachable one fails the open, within the
            # timeout) and refuse a partitioned topic before anything is written.
            await _reach(parsed.connect_timeout, _look_up(client, topic, location), location)
            if read_only:
                return cls(client, location, topic, pchannel, parsed, None)
            producer = await _within(
                parsed.connect_timeout,
                _create_producer(client, topic, parsed, fencing=True),
                location,
            )
            barrier = await _within(parsed.operation_timeout, _send_barrier(producer), location)

            def replacement() -> Awaitable[pulsar_asyncio.Producer]:
                making = _create_producer(client, topic, parsed, fencing=False)
                return _within(parsed.connect_timeout, making, location)

            producers = ProducerKeeper(producer, replacement, topic, parsed.operation_timeout)
            writer = GroupWriter(
                client,
                producers,
                topic,
                term_of_barrier(barrier),
                barrier,
                parsed.operation_timeout,
            )
            return cls(client, location, topic, pchannel, parsed, writer)
        except BaseException:
            if producer is not None:
                await close_quietly(producer, 1.0)
            await _end_lease(client)
            raise

    def append(self, records: Sequence[bytes]) -> asyncio.Future[list[PulsarMessageId]]:
        if self._writer is None:
            raise WALReadOnly(f"pulsar WAL of {self.topic} was opened read-only")
        return self._writer.submit(records)

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        if self._closed:
            raise WALClosed(f"pulsar WAL of {self.topic} is closed")
        scanner = PulsarScanner(self, deliver, selected)
        self._scanners.add(scanner)
        return scanner

    def known_end(self) -> PulsarMessageId | None:
        """The last message this process knows is in the log (a writer's newest
        message or barrier), or None (read-only: ask the broker)."""
        if self._writer is None:
            return None
        return self._writer.end

    def subscriptions(self) -> PulsarSubscriptionStore:
        """The topic ``<topic_prefix>_sub.<P>`` (see ``_subscriptions``); usable on a
        read-only WAL too. Closed with the backend."""
        self._check_open()
        if self._subscriptions is None:
            self._subscriptions = PulsarSubscriptionStore(
                self.client, self.location, self.options, self.pchannel
            )
        return self._subscriptions

    def forget_scanner(self, scanner: PulsarScanner) -> None:
        """Called by a closing scanner."""
        self._scanners.discard(scanner)

    async def latest_message_id(self) -> MessageId | None:
        self._check_open()
        await self._tracker.refresh()
        return self._tracker.tip

    async def last_timetick(self) -> int:
        self._check_open()
        await self._tracker.refresh()
        return self._tracker.max_tick

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        """Where a read must start to include every message with a timetick at or above
        ``timetick``: a binary search over the entries of the last ledger (about log2 of
        their number reader creations, see ``_seek``), so that the read delivers nothing
        below it (but the newest message of the log when none is at or above it); ``all``
        when the target is at or below the last ledger's first tick."""
        self._check_open()
        return await start_at_timetick(
            self.client, self.topic, self.options.operation_timeout, timetick
        )

    async def truncate(self, message_id: MessageId) -> None:
        """Not supported: raises ``InvalidArgument`` (``WALReadOnly`` on a read-only
        WAL) and leaves the log as it is. Pulsar drops data by retention policies set
        through its admin API, which pulsar-client does not offer (and Pulsar Lite does
        not serve)."""
        if self._writer is None:
            raise WALReadOnly(f"pulsar WAL of {self.topic} was opened read-only")
        self._check_open()
        await self._tracker.refresh()
        self._writer.check_not_fenced(self._tracker.newest_barrier)
        raise InvalidArgument(
            "pulsar:// WALs cannot truncate: Pulsar drops data by retention policy, set"
            " through the admin API, which pulsar-client does not offer"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosed(f"pulsar WAL of {self.topic} is closed")

    def begin_close(self) -> None:
        """Start closing: appends queued or made from now on have ``close_timeout``
        seconds to finish, and those failing retriably meanwhile fail with ``WALClosed``
        (see ``GroupWriter.begin_close``). ``aclose`` starts it too; the WAL may call it
        first so that its own waits for appends are bounded the same way. Idempotent."""
        if self._writer is not None:
            self._writer.begin_close(self.options.close_timeout)

    async def aclose(self) -> None:
        """Close within ``close_timeout`` plus about three seconds (see the options): queued
        appends finish or fail, scanners end with ``WALClosed``, the producer and client
        close. Never raises. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.begin_close()
        await self._tracker.aclose()
        closing = [scanner.aclose() for scanner in list(self._scanners)]
        if self._subscriptions is not None:
            closing.append(self._subscriptions.aclose())
        if self._writer is not None:
            closing.append(self._writer.aclose(self.options.close_timeout))
        await asyncio.gather(*closing, return_exceptions=True)  # none of them raises
        await _end_lease(self.client)


async def _within(seconds: float, awaitable: Any, location: str) -> Any:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise BackendUnavailable(
            f"Pulsar broker at pulsar://{location} did not answer within {seconds} s"
        ) from None


async def _reach(seconds: float, look_up: Any, location: str) -> None:
    """``_within`` for the open's first call to the broker: a look-up that times out
    raises ``BackendUnavailable`` saying why, as far as a plain TCP connection to the
    broker's address tells (refused, unresolved, unanswered): the pulsar-client lines that
    said so are off (see ``_client.client_logger``)."""
    try:
        async with asyncio.timeout(seconds):
            await look_up
    except TimeoutError:
        why = await _why_unreachable(location)
        raise BackendUnavailable(
            f"cannot reach the Pulsar broker at pulsar://{location} within {seconds} s"
            f" (connect_timeout): {why}"
        ) from None


#: Seconds the diagnosis of an unreachable broker may take (on the failure path only).
_PROBE_WITHIN = 1.0


async def _why_unreachable(location: str) -> str:
    host, _, port = location.rpartition(":")
    try:
        async with asyncio.timeout(_PROBE_WITHIN):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except TimeoutError:
        return f"a TCP connection to it did not open within {_PROBE_WITHIN} s"
    except ConnectionRefusedError:
        return "a TCP connection to it was refused (nothing listens there)"
    except OSError as exc:
        return f"a TCP connection to it failed ({exc.strerror or exc})"
    writer.close()
    return "it accepts TCP connections but did not answer the Pulsar look-up"


async def _look_up(client: Client, topic: str, location: str) -> None:
    """Reach the broker, and refuse a partitioned topic (``InvalidArgument``): a pchannel
    is one totally ordered log."""
    try:
        partitions = await client.creations.make(topic_partitions(client, topic))
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot look up {topic} at pulsar://{location}") from exc
    if len(partitions) > 1:
        raise InvalidArgument(
            f"Pulsar topic {topic} has {len(partitions)} partitions; a walsvc pchannel needs"
            " a non-partitioned topic (delete it, or pick another topic_prefix)"
        )


async def _create_producer(
    client: Client, topic: str, options: Options, *, fencing: bool
) -> pulsar_asyncio.Producer:
    """The writer's producer: with ``fencing``, the first one of a writer, which takes
    the topic from any other producer; without, a replacement (``_producers``), which
    must not."""
    modes = pulsar_asyncio.ProducerAccessMode
    creating = create_producer(
        client,
        topic,
        send_timeout_millis=max(1, int(options.operation_timeout * 1000)),
        batching_enabled=True,
        batching_max_messages=options.batching_max_messages,
        batching_max_publish_delay_ms=options.batching_max_publish_delay_ms,
        max_pending_messages=100_000,
        block_if_queue_full=False,
        access_mode=modes.ExclusiveWithFencing if fencing else modes.Exclusive,
    )
    try:
        return await client.creations.make(creating, close)
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot create a producer for {topic}") from exc


async def _send_barrier(producer: pulsar_asyncio.Producer) -> PulsarMessageId:
    builder = _pulsar.MessageBuilder()
    builder.content(b"")
    builder.property(BARRIER, "1")
    builder.property(WRITER, this_writer())  # for the error of the writer it fences
    inner = producer._producer
    try:
        future = call_async(lambda done: inner.send_async(builder.build(), done))
        inner.flush_async(lambda result: None)
        return PulsarMessageId.of(await future)
    except PULSAR_ERRORS as exc:
        raise translate(exc, "cannot append the writer's barrier") from exc


async def _end_lease(client: Client) -> None:
    """Stop using the WAL's lease of its client (``_clients``: the client lives on, for
    the process's other and later WALs) once the creations in flight on it ended
    (``STOP_WITHIN`` at most)."""
    await client.creations.aclose(STOP_WITHIN)
