"""Reading a pchannel's topic: readers at exact positions (and their replacements when
they stop delivering), links, reads to a known end, and the tail tracker.

``TailTracker`` answers ``latest_message_id`` and ``last_timetick`` by applying the chain
rule to the log incrementally: each refresh reads only what was appended since the last
one, up to the topic's last entry at the time of the call. The first refresh does not
read the whole log: the chain rule judges a group by the message just before it, so it
reads the last ``WINDOW`` entries of the last ledger and, if they hold no valid data
message, windows eight times larger, down to the start of the log.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, Final, final

import pulsar
import pulsar.asyncio as pulsar_asyncio
from pulsar import _pulsar

from walsvc.core._errors import BackendUnavailable, CorruptRecord, WALClosed

from ._calls import (
    NATIVE,
    Reader,
    Resource,
    close,
    holding,
    last_message_id,
    subscribe,
    unsubscribe,
)
from ._client import (
    PULSAR_ERRORS,
    Client,
    call_in_thread,
    pulsar_id,
    result_name,
    result_of,
    translate,
)
from ._ids import PulsarMessageId
from ._reader import BATCH, OrderedReader
from ._records import ChainValidator, Link, foreign, parse

__all__ = (
    "ForwardRead",
    "TailTracker",
    "behind",
    "close_bound",
    "create_reader",
    "last_entry",
    "read_links",
    "reopen",
)

#: Seconds a tail read waits for a message it knows exists before it replaces its reader.
STALL: Final = 5.0
#: Seconds a read that reached its bound inside a group waits for the rest of it (see
#: ``ForwardRead``): the rest of a batched entry is already in the client.
REST_OF_GROUP: Final = 1.0
#: Entries the first tail read reads back from the last one (then 8x, 64x, ...).
WINDOW: Final = 16
#: Seconds a reader, consumer or producer may take to close once its user is being
#: cancelled or the backend closes (a broker that does not answer would hold a close for
#: the operation timeout).
STOP_WITHIN: Final = 1.0
EARLIEST: Final = "earliest"
LATEST: Final = "latest"


async def create_reader(
    client: Client,
    topic: str,
    start: PulsarMessageId | str,
    *,
    inclusive: bool,
    compacted: bool = False,
) -> OrderedReader:
    """A reader of ``topic`` from ``start`` (an id, ``EARLIEST`` or ``LATEST``);
    ``compacted`` reads the topic's compacted view."""
    if start == EARLIEST:
        start_id: Any = pulsar.MessageId.earliest
    elif start == LATEST:
        start_id = pulsar.MessageId.latest
    else:
        assert isinstance(start, PulsarMessageId)
        start_id = pulsar_id(start)
    # A synchronous creation in a thread (see call_in_thread), with a schema of its own
    # that holds the client (see holding).
    raw = client.raw
    schema = holding(raw)
    conf = _pulsar.ReaderConfiguration()
    conf.receiver_queue_size(BATCH)
    conf.schema(schema.schema_info())
    conf.read_compacted(compacted)
    conf.start_message_id_inclusive(inclusive)
    conf.crypto_failure_action(pulsar.ConsumerCryptoFailureAction.FAIL)
    if isinstance(start_id, pulsar.MessageId):  # earliest and latest are the C++ ids
        start_id = start_id._msg_id

    def make() -> Reader:
        # The holder is made in the thread, so that no C++ reader is ever without the
        # schema that keeps its client alive: one whose caller is gone (a loop that
        # ended meanwhile) is freed with its holder, reader first.
        return Reader(raw.create_reader(topic, start_id, conf), schema)

    async def create() -> OrderedReader:
        return OrderedReader(
            await call_in_thread(make),
            start=start,
            inclusive=inclusive,
            creations=client.creations,
        )

    async def dispose(reader: OrderedReader) -> None:
        await reader.close()

    try:
        return await client.creations.make(create(), dispose)
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot create a reader of {topic}") from exc


def behind(reader: OrderedReader, end: PulsarMessageId | None) -> bool:
    """Whether ``reader`` has yet to deliver a message stored at or before ``end`` (the
    topic's last entry, as ``last_entry`` gives it). False when that cannot be known: an
    empty topic, or a reader created at ``LATEST`` that has delivered nothing."""
    if end is None:
        return False
    position = reader.last
    if position is None:
        start = reader.start
        if start == EARLIEST:
            return True
        if not isinstance(start, PulsarMessageId):
            return False
        if reader.inclusive:
            return (start.ledger, start.entry) <= (end.ledger, end.entry)
        position = start
    return position < end


async def reopen(client: Client, reader: OrderedReader, close_within: float) -> OrderedReader:
    """Close ``reader`` (waiting ``close_within`` seconds at most) and create one that
    resumes right after the last message it delivered, or where it was created if it
    delivered none."""
    topic = reader.topic()
    await close_quietly(reader, close_within)
    if reader.last is not None:
        return await create_reader(client, topic, reader.last, inclusive=False)
    if reader.start is None:
        raise ValueError("cannot reopen a reader whose start is unknown")
    return await create_reader(client, topic, reader.start, inclusive=reader.inclusive)


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


def close_bound(seconds: float) -> float:
    """``seconds``, or ``STOP_WITHIN`` if it is shorter and the running task is being
    cancelled (the close then happens on the way out)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return min(seconds, STOP_WITHIN)
    return seconds


async def close_quietly(resource: OrderedReader | Resource, seconds: float) -> None:
    """Close a reader, consumer or producer, ignoring errors; bounded by ``seconds``
    (by ``STOP_WITHIN`` when the caller is being cancelled)."""
    seconds = close_bound(seconds)
    try:
        async with asyncio.timeout(seconds):
            if isinstance(resource, NATIVE):
                await close(resource)
            else:
                await resource.close()
    except (TimeoutError, *PULSAR_ERRORS):
        pass


async def last_entry(client: Client, topic: str, close_within: float) -> PulsarMessageId | None:
    """The id of the topic's last entry, with batch index -1 (so every message of that
    entry compares at or above it); None if the topic is empty. The caller bounds the
    lookup; closing its consumer afterwards waits ``close_within`` seconds at most. A
    failed lookup raises its translated error, except UnknownError: Pulsar Lite answers
    that for a topic without entries (a strict xfail in tests/test_pulsar_backend.py), so
    it reads as empty.

    The Python client offers ``get_last_message_id`` only on a consumer, which needs a
    (durable) subscription: it lives only for this call, so a crash leaves at most one
    stray ``walsvc-tail-*`` subscription behind. (Pulsar Lite does not serve a reader at
    ``latest`` inclusive, the subscription-free way.)
    """
    subscribing = subscribe(client, topic, f"walsvc-tail-{uuid.uuid4().hex}", receiver_queue_size=1)
    try:
        consumer = await client.creations.make(subscribing, _drop_subscription)
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot look up the tail of {topic}") from exc
    try:
        last = await last_message_id(consumer)
    except PULSAR_ERRORS as exc:
        if result_name(result_of(exc)) == "UnknownError":
            return None  # Pulsar Lite's answer for a topic with no entry
        raise translate(exc, f"cannot look up the tail of {topic}") from exc
    finally:
        try:
            async with asyncio.timeout(close_bound(close_within)):
                await unsubscribe(consumer)
        except (TimeoutError, *PULSAR_ERRORS):
            pass
        await close_quietly(consumer, close_within)
    if last.entry_id() < 0 or last.ledger_id() < 0:
        return None
    return PulsarMessageId(last.ledger_id(), last.entry_id())


async def _drop_subscription(consumer: pulsar_asyncio.Consumer) -> None:
    """Unsubscribe and close the consumer of a ``last_entry`` whose caller was cancelled
    (a durable subscription left behind would hold the topic's entries back)."""
    try:
        await unsubscribe(consumer)
    finally:
        await close(consumer)


@final
class ForwardRead:
    """Reads a topic forward from a position to its end as a caller knows it.

    ``run`` hands every message to ``consume``, in strictly increasing id order, until it
    has read ``through`` (an id known to exist) and the broker reports nothing more, or
    until ``consume`` returns True (it has what it was reading for). A reader that
    delivers nothing (or does not answer whether more is available) for ``stall``
    seconds (default ``STALL``) meanwhile (Pulsar Lite was seen to stop serving one that
    still had entries to send) is closed and replaced by a reader that starts right after
    the last message read. ``run`` has no deadline of its own: the caller bounds it.

    At ``through``, a read that stopped inside a group (``Link.leaves_group_open``) does
    not ask whether more is available: it waits up to ``REST_OF_GROUP`` seconds for the
    rest, and a log that ends there (a writer that stopped mid-group) ends the read. The
    answer cannot be trusted there: Pulsar Lite gives a batched entry's last message id
    with batch index -1, so the client answers from its receiver queue alone, and the
    rest of an entry its I/O thread is still putting in the queue reads as nothing more
    (a tail read lost the end of a group that way in 3 of 1000 tries).
    """

    def __init__(self, client: Client, topic: str, timeout: float, stall: float = STALL) -> None:
        self._client = client
        self._topic = topic
        self._timeout = timeout
        self._stall = stall
        #: How many readers were replaced because they stopped delivering.
        self.stalls = 0

    async def run(
        self,
        start: PulsarMessageId | None,
        *,
        inclusive: bool,
        through: PulsarMessageId,
        consume: Callable[[list[Link]], bool | None],
    ) -> None:
        """Read from ``start`` (None: the earliest message) to at least ``through``, or
        until ``consume`` returns True."""
        last = None if inclusive else start
        group_open = False  # more of the last message's group follows it
        reader = await create_reader(
            self._client,
            self._topic,
            EARLIEST if start is None else start,
            inclusive=inclusive or start is None,
        )
        try:
            while True:
                rest_of_group = group_open and last is not None and last >= through
                try:
                    async with asyncio.timeout(REST_OF_GROUP if rest_of_group else self._stall):
                        if not rest_of_group and last is not None and last >= through:
                            if not await reader.has_message_available():
                                return
                        links = await read_links(reader, lenient=True)
                except TimeoutError:
                    if rest_of_group:
                        return  # the log ends inside a group: its writer stopped there
                    self.stalls += 1  # no answer or no message: the reader is stuck
                    reader = await reopen(self._client, reader, self._timeout)
                    continue
                if last is not None:
                    links = [link for link in links if link.id > last]
                if links:
                    last = links[-1].id
                    group_open = links[-1].leaves_group_open
                    if consume(links):
                        return
        finally:
            await close_quietly(reader, self._timeout)


@final
class TailTracker:
    """The newest valid message id and the greatest timetick of a topic, kept up to date
    by reading the log forward from where the previous refresh stopped (the first
    refresh: from the last window of entries holding a valid data message)."""

    def __init__(self, client: Client, topic: str, timeout: float) -> None:
        self._client = client
        self._topic = topic
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._validator = ChainValidator()
        self._closed = False
        self._reads = ForwardRead(client, topic, timeout)
        #: What the refresh in progress is doing (for the message of a timeout).
        self._step = "starting"
        #: Whether what was read so far reaches back far enough (see ``_read_back``).
        self._anchored = False
        #: The last message read (any kind); the next refresh starts after it.
        self.scanned: PulsarMessageId | None = None
        #: The newest valid data message (what ``latest_message_id`` returns).
        self.tip: PulsarMessageId | None = None
        #: The greatest timetick of any data message read (valid or not). Valid
        #: messages' timeticks grow in log order, so it is at least the tip's.
        self.max_tick = 0
        #: The newest barrier read (the newest writer's, as far as this tracker read).
        self.newest_barrier: Link | None = None
        #: Messages read by every refresh so far.
        self.messages_read = 0

    @property
    def stalls(self) -> int:
        """How many times a refresh replaced a reader that stopped delivering."""
        return self._reads.stalls

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

    async def _refresh(self) -> None:
        self._step = "looking up the last entry"
        bound = await last_entry(self._client, self._topic, self._timeout)
        if bound is None:
            return  # an empty topic (and has_message_available fails on one)
        if not self._anchored:
            await self._read_back(bound)
            return
        self._step = f"reading toward {bound!r}"
        await self._reads.run(self.scanned, inclusive=False, through=bound, consume=self._note)

    async def _read_back(self, bound: PulsarMessageId) -> None:
        """The first refresh: read windows ending at ``bound`` (the last entry), each
        eight times as many entries as the one before, until one holds a valid data
        message or starts the log. A window's first message can only anchor the chain
        (what precedes it is unread), so a group is judged only from the second on.
        A window cut short (the timeout) is read again by the next refresh; the read
        from the start of the log is continued instead."""
        entries = WINDOW
        while True:
            self._validator = ChainValidator()
            self.scanned, self.tip, self.max_tick, self.newest_barrier = None, None, 0, None
            first = bound.entry - entries + 1
            if first <= 0:  # from the start of the log (earlier ledgers too)
                self._anchored = True
                self._step = f"reading from the start toward {bound!r}"
                await self._reads.run(None, inclusive=True, through=bound, consume=self._note)
                return
            start = PulsarMessageId(bound.ledger, first)
            self._step = f"reading back from {bound!r} to {start!r}"
            await self._reads.run(start, inclusive=True, through=bound, consume=self._note)
            if self.tip is not None:
                self._anchored = True
                return
            entries *= 8

    def _note(self, links: list[Link]) -> None:
        self.messages_read += len(links)
        for link in links:
            if link.barrier:
                self.newest_barrier = link
            else:
                tick = link.timetick
                if tick > self.max_tick:
                    self.max_tick = tick
            for valid in self._validator.push(link):
                self.tip = valid.id
            self.scanned = link.id

    async def aclose(self) -> None:
        """Refuse further refreshes (one in progress finishes within its own bound).
        Idempotent."""
        self._closed = True
