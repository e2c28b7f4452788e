"""The ``pulsar://`` backend scanner: one long-lived reading task feeding a bounded queue.

The task owns the Pulsar reader (an ``OrderedReader``: every message once, in log order)
and takes from it a batch at a time, everything the reader's receiver queue holds. It
positions the reader so that the chain rule can be checked from the first message it
delivers (see ``_records``): to start at X it reads X, then reopens at the id X's group
names as its predecessor and validates forward from there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, final

from ..._codec import decode_split
from ..._deliver import DeliverPolicy
from ..._errors import BackendUnavailable, CorruptRecord, WALClosed, WALError
from ..._filter import Filter
from ..._message import ImmutableMessage
from .._base import BackendScanner
from ._ids import PulsarMessageId
from ._log import EARLIEST, LATEST, close_quietly, create_reader, read_links
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

    __slots__ = ("_backend", "_closed", "_queue", "_selected", "_task")

    def __init__(self, backend: PulsarBackend, deliver: DeliverPolicy, selected: Filter) -> None:
        self._backend = backend
        self._selected = selected
        self._closed = False
        self._queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE_BATCHES)
        self._task = asyncio.get_running_loop().create_task(self._pump(deliver))

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        if self._closed:
            raise WALClosed("scanner is closed")
        item = await self._queue.get()
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # for the next caller too
            raise WALClosed("scanner is closed")
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)  # the scanner stays failed
            raise item
        assert isinstance(item, list)
        batch: list[ImmutableMessage] = item
        while not self._queue.empty():
            more = self._queue.get_nowait()
            if not isinstance(more, list):
                self._queue.put_nowait(more)  # raised on the next call
                break
            batch += more
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
        reader: OrderedReader | None = None
        backend = self._backend
        try:
            reader, validator, after, floor, links = await self._position(deliver)
            while True:
                batch: list[ImmutableMessage] = []
                for link in links:
                    valid = validator.push(link)
                    if valid:
                        batch += self._decode(valid, after, floor)
                if batch:
                    await self._queue.put(batch)
                links = await read_links(reader)
        except asyncio.CancelledError:
            raise
        except WALError as exc:
            await self._queue.put(exc)
        except Exception as exc:  # a bug or an untranslated library error: never a hang
            await self._queue.put(BackendUnavailable(f"pulsar scanner failed: {exc!r}"))
        finally:
            if reader is not None:
                await close_quietly(reader, backend.options.operation_timeout)

    async def _position(
        self, deliver: DeliverPolicy
    ) -> tuple[OrderedReader, ChainValidator, PulsarMessageId | None, bool, list[Link]]:
        """(a reader, its validator, the id bound, whether the bound is inclusive, the
        links already read that the validator has yet to see): deliver valid messages
        with id >= bound (inclusive) or > bound."""
        backend = self._backend
        client, topic = backend.client, backend.topic
        if deliver.kind == "all":
            reader = await create_reader(client, topic, EARLIEST, inclusive=True)
            return reader, ChainValidator(), None, True, []
        if deliver.kind == "latest":
            end = backend.known_end()
            if end is None:
                reader = await create_reader(client, topic, LATEST, inclusive=False)
                links = await _first_links(reader)
                return await self._anchor(reader, links, links[0].id, inclusive=True)
            start, inclusive = end, False
        else:
            message_id = deliver.message_id
            if not isinstance(message_id, PulsarMessageId):
                raise CorruptRecord(f"{message_id!r} is not a pulsar:// message id")
            start, inclusive = message_id, deliver.kind == "start_from"
        reader = await create_reader(client, topic, start, inclusive=True)
        links = await _first_links(reader)
        return await self._anchor(reader, links, start, inclusive=inclusive)

    async def _anchor(
        self,
        reader: OrderedReader,
        links: list[Link],
        bound: PulsarMessageId,
        *,
        inclusive: bool,
    ) -> tuple[OrderedReader, ChainValidator, PulsarMessageId, bool, list[Link]]:
        """Continue from ``links[0]`` (the first message at or after ``bound``) with a
        validator that knows enough of the log before it to judge it."""
        validator = ChainValidator()
        first = links[0]
        ends_group = first.barrier or first.member == first.members - 1
        if first.barrier or (not inclusive and first.id == bound and ends_group):
            validator.push(first)  # nothing before it matters for what follows
            return reader, validator, bound, inclusive, links[1:]
        assert first.prev is not None
        await close_quietly(reader, self._backend.options.operation_timeout)
        backend = self._backend
        reader = await create_reader(backend.client, backend.topic, first.prev, inclusive=True)
        return reader, validator, bound, inclusive, []

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


async def _first_links(reader: OrderedReader) -> list[Link]:
    """The next links of ``reader``: at least one."""
    while True:
        links = await read_links(reader)
        if links:
            return links
