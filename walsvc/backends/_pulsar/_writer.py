"""The ``pulsar://`` writer: group commit over one producer, with fencing by the chain.

``submit`` queues records (the serialization point) and returns a future of their ids.
One group is in flight at a time; everything queued meanwhile forms the next group.
Every message of a group names, in ``walsvc.prev``, the message that must precede the
group in the log: the writer's previous message (its last group's last message, or its
barrier). After the acks the writer checks that the group landed right after that
message, contiguously (cheap: consecutive batch indexes in one entry, consecutive entries
in one ledger). When that fails it reads the log from its previous message:

- a foreign barrier there (a newer writer: barriers' positions are their terms) ->
  this group and everything after raise ``WALFenced``; the writer never sends again;
  the error names the barrier's writer when the barrier says who that is (``_identity``;
  when the broker fenced the producer first, the barrier is looked up: best effort,
  within ``_LOOK_UP`` seconds);
- only foreign data (stragglers of older writers) -> the group is invalid for every
  reader; it is sent again after the true end (at most ``_RESENDS`` times, then the
  appends fail with the retriable ``BackendUnavailable``).

A message the client refuses as larger than the broker's maximum message size
(``MessageTooBig``; within the WAL's ``max_message_size`` but over the broker's) fails
its append with ``MessageTooLarge`` at once; the other appends of its group are sent
again as the next group (what was sent of this one is a partial group: never valid).

Closing (``begin_close``, then ``aclose``): see ``begin_close``.

A group whose sends failed is resolved by reading the log: found whole and valid ->
acknowledged with the ids found; not found -> sealed (below), then sent again (the
appends fail with ``BackendUnavailable`` if the producer lost its broker, and a producer
pulsar-client gave up on is replaced: ``_producers``); the log
unreadable -> ``AppendOutcomeUnknown``.

The seal. A failed send may still be persisted by the broker after the writer read the
log and found nothing, and would then be valid if it landed directly after ``prev``.
So before giving up on such a group the writer appends a *seal*: a message whose
``walsvc.prev`` is the end the read found. Once the seal is acked directly after that
end, the position after ``prev`` is taken (by the seal, or by what already followed
``prev``) and the failed group can never become valid. A seal acked elsewhere means
something landed meanwhile (perhaps the group itself): the log is read again from
``prev`` and the group acknowledged if found, else sealed again (``_RESENDS`` times at
most, then ``AppendOutcomeUnknown``, as when a seal cannot be sent at all). A seal is
the first member of a two-member group that never gets its second member, so every
reader drops it under the chain rule (it carries ``walsvc.seal`` for people reading the
topic); like a barrier, it is what the writer's next group names as its ``prev``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, final

from walsvc.backends._identity import named_writer
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    MessageTooLarge,
    WALClosed,
    WALError,
    WALFenced,
)

from ._client import PULSAR_ERRORS, Client
from ._ids import PulsarMessageId
from ._log import ForwardRead, last_entry
from ._producers import ProducerKeeper
from ._records import ChainValidator, Link, term_of_barrier
from ._sender import Fenced, TooBig, contiguous, send_group, send_seal

if TYPE_CHECKING:
    import pulsar.asyncio as pulsar_asyncio

__all__ = ("GroupWriter",)

_RESENDS: Final = 3
_GROUP_RECORDS: Final = 8192
#: Seconds a writer the broker fenced spends at most looking up who fenced it.
_LOOK_UP: Final = 5.0


@final
class GroupWriter:
    """Appends groups of envelopes to one topic after this writer's barrier."""

    def __init__(
        self,
        client: Client,
        producers: ProducerKeeper,
        topic: str,
        term: int,
        barrier: PulsarMessageId,
        timeout: float,
    ) -> None:
        self._client = client
        #: The producer, replaced when pulsar-client gave up on it (``_producers``).
        self._producers = producers
        self._topic = topic
        self._term = term
        self._timeout = timeout
        self._seq = itertools.count()
        self._queue: list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]] = []
        self._task: asyncio.Task[None] | None = None
        self._error: WALError | None = None
        #: The message the next group must follow (None: unknown, read the tail first).
        self.end: PulsarMessageId | None = barrier
        self._good = barrier  # the last message this writer knows is in the log
        self.barrier = barrier
        self.closed = False
        self.resolved_by_reading = 0
        self._reads = ForwardRead(client, topic, timeout)
        self._close_handle: asyncio.TimerHandle | None = None
        self.resent = 0
        #: Seals acked directly after the end they sealed.
        self.sealed = 0

    @property
    def stalls(self) -> int:
        """How many readers of the log this writer replaced because they stopped
        delivering (see ``ForwardRead``)."""
        return self._reads.stalls

    def submit(self, records: Sequence[bytes]) -> asyncio.Future[list[PulsarMessageId]]:
        """Queue ``records`` for the next group; the future resolves to their ids."""
        future: asyncio.Future[list[PulsarMessageId]] = asyncio.get_running_loop().create_future()
        if self._error is not None:
            future.set_exception(self._error)
            return future
        if self.closed:
            future.set_exception(WALClosed(f"pulsar WAL of {self._topic} is closed"))
            return future
        self._queue.append((list(records), future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return future

    def check_not_fenced(self, newest_barrier: Link | None) -> None:
        """Raise ``WALFenced`` if this writer was fenced, or if ``newest_barrier`` (the
        newest barrier a reader of the log saw) is a newer writer's."""
        if self._error is not None:
            raise self._error
        if newest_barrier is not None and newest_barrier.id > self.barrier:
            self._error = self._fenced_error(newest_barrier)
            raise self._error

    def begin_close(self, seconds: float) -> None:
        """Start closing: what is queued or appended from now on has ``seconds`` to
        finish; meanwhile an append that fails retriably fails with ``WALClosed``
        (nothing written, and no retry will be). At the deadline the group in flight
        fails with ``AppendOutcomeUnknown`` and the queue with ``WALClosed``.
        Idempotent."""
        if self._close_handle is None and not self.closed:
            self._close_handle = asyncio.get_running_loop().call_later(seconds, self._abandon)

    def _abandon(self) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()  # _commit fails the group in flight, _drain the queue
        self._fail_queue(WALClosed(f"pulsar WAL of {self._topic} was closed"))

    async def aclose(self, seconds: float) -> None:
        """Finish what is queued within ``seconds`` (``begin_close``), then refuse new
        appends. Idempotent."""
        self.begin_close(seconds)
        task = self._task
        if task is not None:
            await asyncio.wait({task})
        self.closed = True
        if self._close_handle is not None:
            self._close_handle.cancel()
        self._fail_queue(WALClosed(f"pulsar WAL of {self._topic} was closed"))
        await self._producers.aclose()  # freed now, while its client runs (_calls.holding)

    # -- the group loop -------------------------------------------------------------------

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self._commit(self._take_group())
        except asyncio.CancelledError:
            self._fail_queue(WALClosed(f"pulsar WAL of {self._topic} was closed"))
            raise
        finally:
            self._task = None

    def _take_group(
        self,
    ) -> list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]]:
        """The queued calls of the next group: whole calls (one call's records are never
        split), about ``_GROUP_RECORDS`` records at most."""
        taken = 0
        for count, (records, _) in enumerate(self._queue):
            if taken and taken + len(records) > _GROUP_RECORDS:
                group, self._queue = self._queue[:count], self._queue[count:]
                return group
            taken += len(records)
        group, self._queue = self._queue, []
        return group

    async def _commit(
        self, group: list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]]
    ) -> None:
        records = [record for records, _ in group for record in records]
        try:
            if self._error is not None:
                raise self._error
            ids = await self._append_group(records)
        except TooBig as exc:
            self._refuse_too_big(group, exc.indexes)
            return
        except Fenced as exc:
            await self._fence(group, exc.barrier)
            return
        except asyncio.CancelledError:
            self.end = None
            self._fail(
                group,
                AppendOutcomeUnknown(
                    f"pulsar WAL of {self._topic} was closed while a group was in flight"
                ),
            )
            raise
        except WALError as exc:
            if isinstance(exc, WALFenced):
                if exc is not self._error:  # the broker refused the sends: fenced
                    await self._fence(group, None)
                    return
            else:  # part of the group may have been sent: find the true end next time
                self.end = None
            self._fail(group, exc)
            return
        except Exception as exc:  # never leave a caller waiting
            self._fail(group, AppendOutcomeUnknown(f"pulsar append failed: {exc!r}"))
            self.end = None
            return
        offset = 0
        for part, future in group:
            if not future.done():
                future.set_result(ids[offset : offset + len(part)])
            offset += len(part)

    def _refuse_too_big(
        self,
        group: list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]],
        indexes: frozenset[int],
    ) -> None:
        """The appends holding a message the broker refused as too big fail with
        ``MessageTooLarge``; the others go first in the queue, to be sent again as the
        next group (the members sent of this one form a partial group: invalid for
        every reader, and the writer reads the log's end before the next group)."""
        self.end = None
        kept: list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]] = []
        first = 0
        for records, future in group:
            if any(first <= index < first + len(records) for index in indexes):
                if not future.done():
                    future.set_exception(
                        MessageTooLarge(
                            f"pulsar WAL of {self._topic}: the broker refused a message of"
                            " this append as larger than its maximum message size"
                            " (MessageTooBig); nothing of the append was written"
                        )
                    )
            else:
                kept.append((records, future))
            first += len(records)
        self._queue = kept + self._queue

    def _fenced_error(self, barrier: Link | None) -> WALFenced:
        """This writer's error; ``barrier`` is the newer writer's, if known: the error
        gives its term, and its writer if it says who that is (best effort)."""
        by = "a newer writer"
        if barrier is not None:
            try:
                by = f"a writer with term {term_of_barrier(barrier.id)}"
            except CorruptRecord:
                pass
            who = named_writer(barrier.writer)
            if who is not None:
                by = f"{by} ({who})"
        return WALFenced(
            f"pulsar WAL of {self._topic}: term {self._term} was fenced by {by}: another"
            " read-write open of this pchannel; readers open with read_only=True, which"
            " fences nothing"
        )

    async def _fence(
        self,
        group: list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]],
        barrier: Link | None,
    ) -> None:
        """Fail ``group`` and everything queued, and every later append, with this
        writer's ``WALFenced``. ``barrier`` is the newer writer's, if the writer read it;
        when the broker fenced the producer instead, it is looked up first."""
        try:
            if barrier is None:
                barrier = await self._barrier_after_mine()
        finally:  # cancelled meanwhile: the callers still learn they were fenced
            self._error = self._fenced_error(barrier)
            self._fail(group, self._error)
            self._fail_queue(self._error)

    async def _barrier_after_mine(self) -> Link | None:
        """The first barrier after this writer's own (its fencer's), read from the last
        message this writer knows is in the log: for the error of a writer that the broker
        fenced before it read any barrier. Best effort: None if it is not found within
        ``_LOOK_UP`` seconds, or the log cannot be read."""
        found: Link | None = None

        def consume(links: list[Link]) -> bool:
            nonlocal found
            found = next((link for link in links if link.barrier and link.id > self.barrier), None)
            return found is not None

        try:
            async with asyncio.timeout(min(self._timeout, _LOOK_UP)):
                bound = await last_entry(self._client, self._topic, self._timeout)
                if bound is not None:
                    await self._reads.run(
                        self._good, inclusive=False, through=bound, consume=consume
                    )
        except Exception:  # only the error's wording depends on it
            return found
        return found

    def _fail(
        self,
        group: list[tuple[list[bytes], asyncio.Future[list[PulsarMessageId]]]],
        exc: WALError,
    ) -> None:
        if exc.retriable and self._close_handle is not None:
            exc = WALClosed(f"pulsar WAL of {self._topic} is closing: {exc}")
        for _, future in group:
            if not future.done():
                future.set_exception(exc)

    def _fail_queue(self, exc: WALError) -> None:
        queued, self._queue = self._queue, []
        self._fail(queued, exc)

    async def _live_producer(self) -> pulsar_asyncio.Producer:
        """The producer, connected (``ProducerKeeper.connected``: fails fast, nothing
        sent). A replacement the broker refuses as another's exclusive topic
        (``WALFenced``) is checked against the log: ``Fenced`` if a newer writer's
        barrier is there, else ``BackendUnavailable`` (the broker still holds this
        writer's old producer)."""
        try:
            return await self._producers.connected()
        except WALFenced as exc:
            self.end = None
            self.end = await self._read_end()  # Fenced if a newer barrier is in the log
            raise BackendUnavailable(
                f"pulsar WAL of {self._topic}: the broker refused a new producer ({exc}),"
                " and no newer writer's barrier is in the log"
            ) from exc

    async def _append_group(self, records: list[bytes]) -> list[PulsarMessageId]:
        for _attempt in range(_RESENDS):
            producer = await self._live_producer()
            if self.end is None:
                self.end = await self._read_end()
            prev = self.end
            group = f"{self._term}.{next(self._seq)}"
            ids = await send_group(producer, self._topic, records, prev, group, self._timeout)
            if ids is not None and contiguous(prev, ids):
                self.end = self._good = ids[-1]
                return ids
            last_needed = ids[-1] if ids else None
            found = await self._resolve(
                prev, group, len(records), last_needed, unknown_if_unreadable=ids is None
            )
            if found is None and ids is None:  # some bytes may still land: seal first
                found = await self._seal(prev, group, len(records))
            if found is not None:
                self._good = found[-1]
                return found
            self.resent += 1
        raise BackendUnavailable(
            f"pulsar WAL of {self._topic}: other writers' messages kept landing between"
            f" this writer's groups ({_RESENDS} attempts)"
        )

    async def _seal(
        self, prev: PulsarMessageId, group: str, count: int
    ) -> list[PulsarMessageId] | None:
        """Make sure the failed ``group`` (after ``prev``; ``_resolve`` did not find it)
        can never become valid: None once a seal is acked directly after the end read;
        the group's ids if it turns out to have landed valid meanwhile.
        ``AppendOutcomeUnknown`` if neither can be made sure of; ``Fenced``."""
        for _attempt in range(_RESENDS):
            end = self.end
            if end is None:  # unreachable: _resolve read at least ``prev``
                break
            seal = await send_seal(
                self._producers.producer, end, f"{self._term}.s{next(self._seq)}", self._timeout
            )
            if seal is not None and contiguous(end, [seal]):
                self.end = self._good = seal
                self.sealed += 1
                return None
            if seal is None:
                break
            found = await self._resolve(prev, group, count, seal, unknown_if_unreadable=True)
            if found is not None:
                return found
        self.end = None
        raise AppendOutcomeUnknown(
            f"pulsar WAL of {self._topic}: sending a group failed and the writer could not"
            " seal the log after it, so it may still land"
        )

    async def _read_end(self) -> PulsarMessageId:
        """The id of the last message in the log, read from the last message this writer
        knows is there (when the writer lost track); ``Fenced`` if a newer writer's
        barrier is among what it read."""
        end = self._good
        fencer: Link | None = None

        def consume(links: list[Link]) -> None:
            nonlocal end, fencer
            if fencer is None:
                fencer = next((x for x in links if x.barrier and x.id > self.barrier), None)
            end = links[-1].id

        try:
            async with asyncio.timeout(self._timeout):
                bound = await last_entry(self._client, self._topic, self._timeout)
                if bound is not None:
                    await self._reads.run(end, inclusive=False, through=bound, consume=consume)
        except TimeoutError:
            raise BackendUnavailable(
                f"reading the end of {self._topic} took longer than {self._timeout} s"
            ) from None
        if fencer is not None:
            raise Fenced(fencer)
        return end

    async def _resolve(
        self,
        prev: PulsarMessageId,
        group: str,
        count: int,
        last_needed: PulsarMessageId | None,
        *,
        unknown_if_unreadable: bool,
    ) -> list[PulsarMessageId] | None:
        """Read the log from ``prev`` (at least to ``last_needed``, else to the last entry
        the broker reports, then on while more is available): the ids of this group if
        it landed valid, None if it did not (``self.end`` moves to the true end);
        ``Fenced`` if a newer barrier lies between. If the log cannot be read:
        ``AppendOutcomeUnknown`` with ``unknown_if_unreadable`` (some send of the group
        failed), else ``BackendUnavailable``."""
        self.resolved_by_reading += 1
        self.end = None
        links: list[Link] = []
        try:
            async with asyncio.timeout(self._timeout):
                if last_needed is None:
                    last_needed = await last_entry(self._client, self._topic, self._timeout)
                await self._reads.run(
                    prev,
                    inclusive=True,
                    through=prev if last_needed is None else last_needed,
                    consume=links.extend,
                )
        except (TimeoutError, WALError, *PULSAR_ERRORS) as exc:
            if unknown_if_unreadable:
                raise AppendOutcomeUnknown(
                    f"pulsar WAL of {self._topic}: sending failed and the log could not be"
                    f" read to find out whether the group landed: {exc!r}"
                ) from exc
            raise BackendUnavailable(f"reading {self._topic} failed: {exc!r}") from exc
        validator = ChainValidator()
        mine: list[PulsarMessageId] = []
        fencer: Link | None = None
        for link in links:
            if fencer is None and link.barrier and link.id > self.barrier:
                fencer = link
            mine += [valid.id for valid in validator.push(link) if valid.group == group]
        if links:
            self.end = links[-1].id
        if len(mine) == count:  # landed whole and valid: acknowledged, whatever follows
            if fencer is not None:  # ... but a newer writer's barrier follows it: never send again
                self._error = self._fenced_error(fencer)
            return mine
        if fencer is not None:
            raise Fenced(fencer)
        return None
