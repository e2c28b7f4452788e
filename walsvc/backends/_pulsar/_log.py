"""Reading a pchannel's topic: readers at exact positions, links, and the tail tracker.

``TailTracker`` answers ``latest_message_id`` and ``last_timetick`` by applying the chain
rule to the log incrementally: each refresh reads only what was appended since the last
one, up to the topic's last entry at the time of the call.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Final, final

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..._errors import BackendUnavailable, CorruptRecord, WALClosed
from ._client import PULSAR_ERRORS, pulsar_id, translate
from ._ids import PulsarMessageId
from ._reader import BATCH, OrderedReader
from ._records import ChainValidator, Link, foreign, parse

__all__ = ("TailTracker", "create_reader", "read_links")

#: Seconds a tail read waits for a message it knows exists before it replaces its reader.
STALL: Final = 5.0
EARLIEST: Final = "earliest"
LATEST: Final = "latest"


async def create_reader(
    client: pulsar_asyncio.Client,
    topic: str,
    start: PulsarMessageId | str,
    *,
    inclusive: bool,
) -> OrderedReader:
    """A reader of ``topic`` from ``start`` (an id, ``EARLIEST`` or ``LATEST``)."""
    if start == EARLIEST:
        start_id: Any = pulsar.MessageId.earliest
    elif start == LATEST:
        start_id = pulsar.MessageId.latest
    else:
        assert isinstance(start, PulsarMessageId)
        start_id = pulsar_id(start)
    try:
        reader = await client.create_reader(
            topic,
            start_id,
            start_message_id_inclusive=inclusive,
            receiver_queue_size=BATCH,
        )
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot create a reader of {topic}") from exc
    return OrderedReader(reader)


async def read_links(reader: OrderedReader, *, lenient: bool = False) -> list[Link]:
    """The next messages of ``reader`` as ``Link``s (see ``OrderedReader.next_batch``:
    in strictly increasing id order, empty only when all that came were re-deliveries).
    A message that is not a walsvc record raises ``CorruptRecord``, or with ``lenient``
    comes back as a foreign link (one that is never valid and breaks the chain of what
    follows it)."""
    batch = await reader.next_batch()
    if not lenient:
        return [parse(message, message_id) for message_id, message in batch]
    links: list[Link] = []
    for message_id, message in batch:
        try:
            links.append(parse(message, message_id))
        except CorruptRecord:
            links.append(foreign(message_id))
    return links


async def close_quietly(resource: Any, seconds: float) -> None:
    """Close a reader, consumer or producer, ignoring errors; bounded by ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            await resource.close()
    except (TimeoutError, *PULSAR_ERRORS):
        pass


@final
class TailTracker:
    """The newest valid message id and the greatest timetick of a topic, kept up to date
    by reading the log forward from where the previous refresh stopped."""

    def __init__(self, client: pulsar_asyncio.Client, topic: str, timeout: float) -> None:
        self._client = client
        self._topic = topic
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._validator = ChainValidator()
        self._closed = False
        #: How many times a refresh replaced a reader that stopped delivering (``STALL``).
        self.stalls = 0
        #: What the refresh in progress is doing (for the message of a timeout).
        self._step = "starting"
        #: The last message read (any kind); the next refresh starts after it.
        self.scanned: PulsarMessageId | None = None
        #: The newest valid data message (what ``latest_message_id`` returns).
        self.tip: PulsarMessageId | None = None
        #: The greatest timetick of any data message read (valid or not).
        self.max_tick = 0
        #: The newest barrier read (the newest writer's, as far as this tracker read).
        self.newest_barrier: PulsarMessageId | None = None

    async def refresh(self) -> None:
        """Read the log from the last refresh up to its current end (within the
        operation timeout; ``BackendUnavailable`` otherwise)."""
        async with self._lock:
            if self._closed:
                raise WALClosed(f"the pulsar WAL of {self._topic} is closed")
            try:
                async with asyncio.timeout(self._timeout):
                    await self._refresh()
            except TimeoutError:
                raise BackendUnavailable(
                    f"reading the tail of {self._topic} took longer than {self._timeout} s"
                    f" ({self._step}; read up to {self.scanned!r})"
                ) from None

    async def last_entry(self) -> tuple[int, int] | None:
        """(ledger, entry) of the topic's last entry; None if the topic is empty.

        The Python client offers ``get_last_message_id`` only on a consumer, which needs
        a (durable) subscription: it lives only for this call, so a crash leaves at most
        one stray ``walsvc-tail-*`` subscription behind. (Pulsar Lite does not serve a
        reader at ``latest`` inclusive, the subscription-free way.)
        """
        try:
            consumer = await self._client.subscribe(
                self._topic,
                f"walsvc-tail-{uuid.uuid4().hex}",
                consumer_type=pulsar.ConsumerType.Exclusive,
                receiver_queue_size=1,
            )
        except PULSAR_ERRORS as exc:
            raise translate(exc, f"cannot look up the tail of {self._topic}") from exc
        try:
            last = await consumer.get_last_message_id()
        except PULSAR_ERRORS:
            return None  # Pulsar Lite answers UnknownError for a topic with no entry
        finally:
            try:
                await consumer.unsubscribe()
            except PULSAR_ERRORS:
                pass
            await close_quietly(consumer, self._timeout)
        if last.entry_id() < 0 or last.ledger_id() < 0:
            return None
        return (last.ledger_id(), last.entry_id())

    async def _refresh(self) -> None:
        self._step = "looking up the last entry"
        bound = await self.last_entry()
        if bound is None:
            return  # an empty topic (and has_message_available fails on one)
        reader = await self._reader_after(self.scanned)
        try:
            while True:
                at_bound = (
                    self.scanned is not None and (self.scanned.ledger, self.scanned.entry) >= bound
                )
                if at_bound:
                    self._step = f"asking whether anything follows entry {bound}"
                    if not await reader.has_message_available():
                        return
                self._step = f"waiting for the next message, toward entry {bound}"
                try:
                    async with asyncio.timeout(STALL):
                        links = await read_links(reader, lenient=True)
                except TimeoutError:
                    # Messages up to ``bound`` exist, yet none came: a reader the broker
                    # stopped serving (seen with Pulsar Lite). A new one resumes there.
                    self.stalls += 1
                    await close_quietly(reader, self._timeout)
                    reader = await self._reader_after(self.scanned)
                    continue
                for link in links:
                    if self.scanned is None or link.id > self.scanned:
                        self._note(link)
        finally:
            await close_quietly(reader, self._timeout)

    async def _reader_after(self, position: PulsarMessageId | None) -> OrderedReader:
        if position is None:
            return await create_reader(self._client, self._topic, EARLIEST, inclusive=True)
        return await create_reader(self._client, self._topic, position, inclusive=False)

    def _note(self, link: Link) -> None:
        if link.barrier:
            self.newest_barrier = link.id
        else:
            tick = link.timetick
            if tick > self.max_tick:
                self.max_tick = tick
        for valid in self._validator.push(link):
            self.tip = valid.id
        self.scanned = link.id

    async def aclose(self) -> None:
        """Refuse further refreshes. Idempotent."""
        async with self._lock:
            self._closed = True
