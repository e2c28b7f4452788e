"""Reading a topic's messages in log order, without the client's asynchronous calls.

pulsar-client's ``read_next_async`` (3.13's; what ``pulsar.asyncio.Reader.read_next`` awaits)
can hand out a message ahead of the one queued just before it. When a message arrives,
the C++ consumer first checks, under a lock, whether an asynchronous receive is waiting,
and only after releasing that lock puts the message in its receiver queue
(``ConsumerImpl::executeNotifyCallback``, pulsar-client-cpp). A receive registered in
between finds the queue empty and waits for the *next* message, while this one sits in
the queue: the reader sees N+1 before N, and at the end of a topic it does not see N at
all until some later message arrives. walsvc drops an id below the last one as a
re-delivery, so N would be lost to the scan (seen once in about 15 runs of the Pulsar
conformance test, with a scanner that keeps up with its writer).

``OrderedReader`` never registers an asynchronous receive. It pops the receiver queue
synchronously: on the event loop, what is already queued (about 2 us a message, the GIL
released); in a worker thread, blocking, when the queue is empty. Messages then leave in
exactly the order the client's I/O thread queued them. It is asked and closed through
synchronous calls in threads too (``call_in_thread``), as ``_log.create_reader`` creates
it: with the asynchronous ones, readers made, read and closed by the hundred corrupted
pulsar-client's heap (ARCHITECTURE.md, "The Pulsar read path").
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, final

import pulsar

from walsvc.core._errors import WALClosed

from .._process_threads import ProcessThreads
from ._calls import Reader
from ._client import PULSAR_ERRORS, call_in_thread, translate
from ._clients import retire
from ._creations import Creations
from ._ids import PulsarMessageId

__all__ = ("OrderedReader", "redeliveries_dropped")

#: The most messages one ``next_batch`` returns (the readers' receiver queue size).
BATCH: Final = 1000
#: How long one blocking pop in a worker thread waits before it returns empty-handed
#: (and the event loop starts another): the longest a worker stays with one reader, and
#: the longest a close waits for it (see ``OrderedReader.close``). Not shorter: see
#: ARCHITECTURE.md, "The Pulsar read path", for the runs with shorter pops.
_WAIT_MS: Final = 200
#: Worker threads shared by every waiting reader of the process. A reader waits in one
#: only while its queue is empty; with more readers than this waiting at once, each gets
#: a worker in turn (for up to ``_WAIT_MS`` at a time).
_WORKERS: Final = 64

#: Messages a reader delivered again (ids not above the previous one) and that were
#: dropped; Pulsar Lite re-sends ranges of entries to a reader now and then.
redeliveries_dropped = 0

_waiters: Final = ProcessThreads(_WORKERS, "walsvc-pulsar-read")


def _pop_queued(raw: Any, limit: int) -> list[Any]:
    """Up to ``limit`` messages the C reader ``raw`` already holds, without waiting."""
    out: list[Any] = []
    while len(out) < limit:
        try:
            out.append(raw.read_next(0))
        except pulsar.Timeout:
            break
    return out


def _wait_for_messages(raw: Any) -> list[Any]:
    """In a worker thread: block (up to ``_WAIT_MS``) for the next message of ``raw``,
    then take whatever else it holds. Empty if nothing came."""
    try:
        first = raw.read_next(_WAIT_MS)
    except pulsar.Timeout:
        return []
    return [first, *_pop_queued(raw, BATCH - 1)]


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark the outcome of an abandoned wait or close as seen (a wait fails once the
    reader closes)."""
    if not future.cancelled():
        future.exception()


@final
class OrderedReader:
    """The messages of one ``Reader``, each once, in strictly increasing
    id order (a message delivered again, at or below the last id returned, is dropped).
    One task reads it at a time.

    ``start`` and ``inclusive`` record where the reader was created (an id, or the
    names ``"earliest"`` / ``"latest"``; None if unknown) so that a replacement can
    resume where it left off (``_log.reopen``). ``creations``, those of the reader's
    client, see its close through before the WAL's close ends (None: nobody waits)."""

    __slots__ = (
        "_closing",
        "_creations",
        "_last",
        "_raw",
        "_reader",
        "_waiting",
        "inclusive",
        "start",
    )

    def __init__(
        self,
        reader: Reader,
        *,
        start: PulsarMessageId | str | None = None,
        inclusive: bool = False,
        creations: Creations | None = None,
    ) -> None:
        self._reader = reader
        self.start = start
        self.inclusive = inclusive
        self._raw: Any = reader._reader  # the C++ reader
        self._last: PulsarMessageId | None = None
        #: A blocking pop running in a worker; a cancelled ``next_batch`` leaves it for
        #: the next call, so what it pops is not lost.
        self._waiting: asyncio.Future[list[Any]] | None = None
        self._creations = creations
        self._closing: asyncio.Future[None] | None = None

    def topic(self) -> str:
        """The topic read."""
        return str(self._reader.topic())

    @property
    def last(self) -> PulsarMessageId | None:
        """The id of the last message ``next_batch`` returned (None before the first)."""
        return self._last

    async def next_batch(self) -> list[tuple[PulsarMessageId, Any]]:
        """The next messages (at most ``BATCH``) with their ids: every message already
        queued, or, when none is, the first to arrive and what came with it. Empty only
        if every message that came was a re-delivery (so a caller reading to a bound can
        look at ``has_message_available`` again). Pulsar errors are translated
        (``WALClosed`` once the reader is closed, or closing: no pop starts then, so none
        races the close). Cancelling it loses no message."""
        messages: list[Any] = []
        while not messages:
            if self._closing is not None:
                raise WALClosed(f"the reader of {self.topic()} is closed")
            if self._waiting is None:
                try:
                    messages = _pop_queued(self._raw, BATCH)
                except PULSAR_ERRORS as exc:
                    raise translate(exc, f"reading {self.topic()} failed") from exc
                if messages:
                    break
                self._waiting = asyncio.get_running_loop().run_in_executor(
                    _waiters.executor(), _wait_for_messages, self._raw
                )
            waiting = self._waiting
            try:
                messages = await asyncio.shield(waiting)
            except PULSAR_ERRORS as exc:
                raise translate(exc, f"reading {self.topic()} failed") from exc
            finally:
                if waiting.done():
                    self._waiting = None
        return self._fresh(messages)

    def _fresh(self, messages: list[Any]) -> list[tuple[PulsarMessageId, Any]]:
        global redeliveries_dropped
        last = self._last
        out: list[tuple[PulsarMessageId, Any]] = []
        for message in messages:
            message_id = PulsarMessageId.of(message.message_id())
            if last is not None and message_id <= last:
                redeliveries_dropped += 1
                continue
            out.append((message_id, message))
            last = message_id
        self._last = last
        return out

    async def has_message_available(self) -> bool:
        """Whether the topic holds a message after the last one ``next_batch`` returned
        (the client asks the broker if none is queued). Only between reads: a wait left
        by a cancelled ``next_batch`` may be holding that message, so with one
        outstanding this raises ``RuntimeError``."""
        if self._waiting is not None:
            raise RuntimeError("has_message_available while a cancelled read still waits")
        try:
            return bool(await call_in_thread(self._raw.has_message_available))
        except PULSAR_ERRORS as exc:
            raise translate(exc, f"reading {self.topic()} failed") from exc

    async def owes_messages(self) -> bool:
        """Whether the topic holds a message after the last one ``next_batch`` returned
        that this reader has yet to return (for a reader that has been quiet): a wait
        left by a cancelled ``next_batch`` is let finish first (at most ``_WAIT_MS``); if
        it brought messages, the answer is False and they go to the next ``next_batch``.
        Otherwise the broker is asked (``has_message_available``). Pulsar errors are
        translated."""
        waiting = self._waiting
        if waiting is not None:
            await asyncio.wait((waiting,))
            if waiting.exception() is not None or waiting.result():
                return False  # the next next_batch returns them, or raises
            self._waiting = None
        return await self.has_message_available()

    async def close(self) -> None:
        """Close the reader, once a blocking pop in a worker has left the client's code
        (it returns within ``_WAIT_MS``; what it brought is dropped):
        pulsar-client's close of a reader races a receive in flight on another thread,
        and the loser corrupts the heap (SIGABRT or SIGSEGV later, anywhere; seen in
        ``make test`` while the other worker loaded the machine). A caller cancelled or
        timed out meanwhile does not stop the close: it goes on, and the WAL's close
        waits for it (``Creations.see_through``). Idempotent: a second call awaits the
        first's close."""
        if self._closing is None:
            closing = self._close_after_the_pop()
            if self._creations is not None:
                self._closing = self._creations.see_through(closing)
            else:
                self._closing = asyncio.ensure_future(closing)
                self._closing.add_done_callback(_retrieve)
        await asyncio.shield(self._closing)

    async def _close_after_the_pop(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.add_done_callback(_retrieve)
            await asyncio.wait((waiting,))
        retire(self._reader)  # a timer of it may still be queued (``_clients.retire``)
        await call_in_thread(self._raw.close)
