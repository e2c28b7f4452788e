"""The ``pulsar://`` backend scanner: one long-lived reading task feeding a bounded queue.

The task owns the Pulsar reader (an ``OrderedReader``: every message once, in log order)
and takes from it a batch at a time, everything the reader's receiver queue holds. It
positions the reader so that the chain rule can be checked from the first message it
delivers (see ``_records``): to start at X it reads X, then reopens at the id X's group
names as its predecessor and validates forward from there.

A reader that delivers nothing for ``STALL`` seconds is asked whether the broker holds a
message it has yet to deliver (its ``has_message_available``: one request on the
reader's own connection); if so (Pulsar Lite was seen to stop serving a reader), it is
replaced by one that resumes right after the last message read. A reader that has
delivered nothing yet, or that cannot answer, is checked against the topic's last entry
instead (``last_entry``: a short-lived subscription). An idle scanner at the tail so
costs one request per ``STALL``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, final

from walsvc.backends._base import BackendScanner
from walsvc.core._budget import CACHED_COST, DECODE_COST, STEP, turn
from walsvc.core._codec import decode_split
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import BackendUnavailable, CorruptRecord, WALClosed, WALError
from walsvc.core._filter import Filter
from walsvc.core._message import ImmutableMessage

from ._ids import PulsarMessageId
from ._log import (
    EARLIEST,
    LATEST,
    STALL,
    behind,
    close_quietly,
    create_reader,
    last_entry,
    read_links,
    reopen,
)
from ._records import ChainValidator, Link

if TYPE_CHECKING:
    from ._backend import PulsarBackend
    from ._reader import OrderedReader

__all__ = ("PulsarScanner",)

_QUEUE_BATCHES: Final = 64
_CLOSED: Final = object()


@final
class PulsarScanner(BackendScanner):
    """Valid messages of one topic from a deliver position, filtered, in log order."""

    __slots__ = ("_backend", "_closed", "_queue", "_reader", "_selected", "_task", "stalls")

    def __init__(self, backend: PulsarBackend, deliver: DeliverPolicy, selected: Filter) -> None:
        self._backend = backend
        self._selected = selected
        self._closed = False
        self._reader: OrderedReader | None = None
        #: How many readers this scanner replaced because they stopped delivering.
        self.stalls = 0
        self._queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE_BATCHES)
        self._task = asyncio.get_running_loop().create_task(self._pump(deliver))

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        if self._closed:
            raise WALClosed("scanner is closed")
        # What the reading task decoded is handed over a step at a time too: the stages
        # after the scanner handle each message (see walsvc.core._budget).
        budget = await turn()
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # for the next caller too
            raise WALClosed("scanner is closed")
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)  # the scanner stays failed
            raise item
        assert isinstance(item, list)
        batch: list[ImmutableMessage] = item
        # Up to a step of what the reading task queued (see walsvc.core._budget).
        while not self._queue.empty() and len(batch) < STEP // DECODE_COST:
            more = self._queue.get_nowait()
            if not isinstance(more, list):
                self._queue.put_nowait(more)  # raised on the next call
                break
            batch += more
        budget.spend(len(batch) * CACHED_COST)
        return batch

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.forget_scanner(self)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(_CLOSED)

    # -- the reading task ---------------------------------------------------------------

    async def _pump(self, deliver: DeliverPolicy) -> None:
        try:
            validator, after, floor, links = await self._position(deliver)
            step = STEP // DECODE_COST
            while True:
                # The links are validated and decoded a step at a time (see
                # walsvc.core._budget), each step queued on its own.
                for start in range(0, len(links), step):
                    budget = await turn()
                    batch: list[ImmutableMessage] = []
                    for link in links[start : start + step]:
                        valid = validator.push(link)
                        if valid:
                            batch += self._decode(valid, after, floor)
                    budget.spend(min(step, len(links) - start) * DECODE_COST)
                    if batch:
                        await self._queue.put(batch)
                links = await self._next_links()
        except asyncio.CancelledError:
            raise
        except WALError as exc:
            await self._queue.put(exc)
        except Exception as exc:  # a bug or an untranslated library error: never a hang
            await self._queue.put(BackendUnavailable(f"pulsar scanner failed: {exc!r}"))
        finally:
            await self._close_reader()

    async def _position(
        self, deliver: DeliverPolicy
    ) -> tuple[ChainValidator, PulsarMessageId | None, bool, list[Link]]:
        """Open the reader; (its validator, the id bound, whether the bound is inclusive,
        the links already read that the validator has yet to see): deliver valid
        messages with id >= bound (inclusive) or > bound."""
        backend = self._backend
        if deliver.kind == "all":
            await self._open(EARLIEST, inclusive=True)
            return ChainValidator(), None, True, []
        if deliver.kind == "latest":
            end = backend.known_end()
            if end is None:
                await self._open(LATEST, inclusive=False)
                links = await self._first_links()
                return await self._anchor(links, links[0].id, inclusive=True)
            start, inclusive = end, False
        else:
            message_id = deliver.message_id
            if not isinstance(message_id, PulsarMessageId):
                raise CorruptRecord(f"{message_id!r} is not a pulsar:// message id")
            start, inclusive = message_id, deliver.kind == "start_from"
        await self._open(start, inclusive=True)
        links = await self._first_links()
        return await self._anchor(links, start, inclusive=inclusive)

    async def _anchor(
        self, links: list[Link], bound: PulsarMessageId, *, inclusive: bool
    ) -> tuple[ChainValidator, PulsarMessageId, bool, list[Link]]:
        """Continue from ``links[0]`` (the first message at or after ``bound``) with a
        validator that knows enough of the log before it to judge it."""
        validator = ChainValidator()
        first = links[0]
        ends_group = first.barrier or first.member == first.members - 1
        if first.barrier or (not inclusive and first.id == bound and ends_group):
            validator.push(first)  # nothing before it matters for what follows
            return validator, bound, inclusive, links[1:]
        assert first.prev is not None
        await self._open(first.prev, inclusive=True)
        return validator, bound, inclusive, []

    async def _open(self, start: PulsarMessageId | str, *, inclusive: bool) -> None:
        """Read from ``start`` (an id, ``EARLIEST`` or ``LATEST``) on, with a new reader."""
        await self._close_reader()
        backend = self._backend
        self._reader = await create_reader(
            backend.client, backend.topic, start, inclusive=inclusive
        )

    async def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await close_quietly(reader, self._backend.options.operation_timeout)

    async def _first_links(self) -> list[Link]:
        """The reader's next links: at least one."""
        while True:
            links = await self._next_links()
            if links:
                return links

    async def _next_links(self) -> list[Link]:
        """The reader's next links; a stalled reader is replaced (see the module's
        docstring)."""
        backend = self._backend
        timeout = backend.options.operation_timeout
        while True:
            reader = self._reader
            assert reader is not None
            try:
                async with asyncio.timeout(STALL):
                    return await read_links(reader)
            except TimeoutError:
                pass
            if await self._stalled(reader):
                self.stalls += 1
                self._reader = None  # reopen closes it, even if no new reader comes
                self._reader = await reopen(backend.client, reader, timeout)

    async def _stalled(self, reader: OrderedReader) -> bool:
        """Whether quiet ``reader`` owes a message the broker holds (see the module's
        docstring); False when that cannot be found out (the broker is away: the client
        reconnects and the reader goes on)."""
        backend = self._backend
        timeout = backend.options.operation_timeout
        if reader.last is not None:
            try:
                async with asyncio.timeout(timeout):
                    return await reader.owes_messages()
            except (TimeoutError, WALError):
                pass
        try:
            async with asyncio.timeout(timeout):
                end = await last_entry(backend.client, backend.topic, timeout)
        except (TimeoutError, WALError):
            return False
        return behind(reader, end)

    def _decode(
        self, valid: list[Link], bound: PulsarMessageId | None, inclusive: bool
    ) -> list[ImmutableMessage]:
        selected = self._selected
        out: list[ImmutableMessage] = []
        for link in valid:
            if bound is not None and (link.id < bound or (link.id == bound and not inclusive)):
                continue
            message = decode_split(link.head, link.data, link.id)
            if selected.is_everything or selected.admits(message):
                out.append(message)
        return out
