"""``memory://NAME``: an in-process log for unit tests and benchmarks.

Logs live for the life of the process, keyed by (NAME, pchannel), so a WAL reopened on the
same URL sees what was appended before. Records are stored encoded, exactly as durable
backends store them, so tests exercise the same codec and filter paths.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Final, final

from walsvc.core._budget import DECODE_COST, STEP, turn
from walsvc.core._codec import timetick_of
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import InvalidArgument, WALClosed, WALFenced, WALTruncated
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, SequenceMessageId
from walsvc.core._message import ImmutableMessage
from walsvc.core._runs import decode_run

from ._base import Backend, BackendScanner
from ._subscriptions import StoredSubscription, SubscriptionStore

__all__ = ("MemoryBackend", "MemoryMessageId", "MemorySubscriptionStore", "backend_class")


@final
class MemoryMessageId(SequenceMessageId, frozen=True, gc=False):
    """Position in a ``memory://`` log: a dense sequence number from 0."""

    scheme = "memory"


#: Records per chunk of a log (a power of two).
CHUNK: Final = 1 << 14
_SHIFT: Final = CHUNK.bit_length() - 1
_MASK: Final = CHUNK - 1


@final
class _Records:
    """A log's records in chunks of ``CHUNK``, so that neither an append nor a truncation
    holds the loop however long the log is, and the cycle collector reads each record
    once at most.

    One list of them all did not: growing it reallocates it, which copies it (and faults
    its new pages in) once the allocator serves blocks that large from its heap, as glibc
    does after the process freed one (its mmap threshold rises): with keyed
    ``append_many`` of 100 on asyncio, appends took 8-32 ms at 0.4-1.6M records. A
    truncation moved everything after the point it cut. And every collection of the
    list's generation read each record's header (the list is young until a collection
    promotes it, and an append path that allocates nothing the collector counts triggers
    few). Here the newest chunk is a list, appended to in C; a full one becomes a tuple,
    which the collector stops tracking the first time it reads it (a tuple of bytes can
    be in no cycle)."""

    __slots__ = ("_chunks", "_head", "_last", "_len")

    def __init__(self) -> None:
        self._last: list[bytes] = []  # the chunk appended to: never full
        self._chunks: list[Sequence[bytes]] = [self._last]
        self._head = 0  # records of the first chunk truncated away
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> bytes:
        """Record ``index`` (0 <= index < len)."""
        at = index + self._head
        return self._chunks[at >> _SHIFT][at & _MASK]

    def run(self, start: int, end: int) -> list[bytes]:
        """Records ``start`` to ``end`` (excluded)."""
        out: list[bytes] = []
        at, stop = start + self._head, end + self._head
        chunks = self._chunks
        while at < stop:
            first = at & _MASK
            last = min(CHUNK, first + stop - at)
            out += chunks[at >> _SHIFT][first:last]
            at += last - first
        return out

    def extend(self, records: Sequence[bytes]) -> None:
        """Append ``records``."""
        count = len(records)
        self._len += count
        last = self._last
        if len(last) + count < CHUNK:  # nearly always
            last += records
            return
        at = 0
        while at < count:
            taken = min(CHUNK - len(last), count - at)
            last += records[at : at + taken]
            at += taken
            if len(last) == CHUNK:
                self._chunks[-1] = tuple(last)
                last = self._last = []
                self._chunks.append(last)

    def drop_front(self, count: int) -> None:
        """Truncate the first ``count`` records away."""
        self._len -= count
        self._head += count
        whole = self._head >> _SHIFT
        if whole:
            del self._chunks[:whole]
            self._head &= _MASK


class _Log:
    """One pchannel's records; ``records[i]`` has sequence number ``first_seq + i``."""

    __slots__ = ("first_seq", "last_record", "records", "term", "waiters")

    def __init__(self) -> None:
        self.records = _Records()
        self.first_seq = 0
        self.term = 0
        self.last_record = b""  # the newest envelope, kept even when truncated
        self.waiters: set[asyncio.Future[None]] = set()

    @property
    def end_seq(self) -> int:
        return self.first_seq + len(self.records)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


_logs: dict[tuple[str, str], _Log] = {}


class _Ids:
    """An awaitable that is ready at once (memory appends are durable when made)."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[MessageId]) -> None:
        self.ids = ids

    def __await__(self) -> Generator[Any, None, Sequence[MessageId]]:
        return self.ids
        yield  # makes this a generator


@final
class MemoryBackend(Backend):
    """A pchannel of a ``memory://`` log. Appends are acknowledged at once; a newer
    read-write open fences older writers through the log's term."""

    __slots__ = (
        "_closed",
        "_location",
        "_log",
        "_scanners",
        "_subscriptions",
        "pchannel",
        "read_only",
        "term",
    )

    scheme = "memory"
    message_id_class = MemoryMessageId
    immediate_acks = True
    retriable_appends = False

    def __init__(self, log: _Log, location: str, pchannel: str, read_only: bool) -> None:
        self._log = log
        self._location = location
        self._subscriptions: MemorySubscriptionStore | None = None
        self.pchannel = pchannel
        self.read_only = read_only
        self._closed = False
        self._scanners: set[_MemoryScanner] = set()
        if read_only:
            self.term = 0
        else:
            log.term += 1
            self.term = log.term

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> MemoryBackend:
        if options:
            raise TypeError(f"unknown option(s) for memory:// WALs: {', '.join(options)}")
        log = _logs.get((location, pchannel))
        if log is None:
            log = _logs[(location, pchannel)] = _Log()
        return cls(log, location, pchannel, read_only)

    def _check_writer(self) -> None:
        if self._closed:
            raise WALClosed(f"memory WAL {self.pchannel!r} is closed")
        if self._log.term != self.term:
            raise WALFenced(
                f"memory WAL {self.pchannel!r}: term {self.term} was fenced by term"
                f" {self._log.term} (another read-write open of this pchannel, in this"
                " process; readers open with read_only=True, which fences nothing)"
            )

    def append(self, records: Sequence[bytes]) -> _Ids:
        return _Ids(self.append_now(records))

    def append_now(self, records: Sequence[bytes]) -> list[MessageId]:
        log = self._log
        if self._closed or log.term != self.term:
            self._check_writer()
        first = log.first_seq + len(log.records)
        log.records.extend(records)
        log.last_record = records[-1]
        if log.waiters:
            log.wake()
        if len(records) == 1:
            return [MemoryMessageId(first)]
        return [MemoryMessageId(seq) for seq in range(first, first + len(records))]

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        if self._closed:
            raise WALClosed(f"memory WAL {self.pchannel!r} is closed")
        log = self._log
        if deliver.kind == "all":
            start = log.first_seq
        elif deliver.kind == "latest":
            start = log.end_seq
        else:
            position = _seq_of(deliver.message_id)
            start = position if deliver.kind == "start_from" else position + 1
        scanner = _MemoryScanner(self, start, selected)
        self._scanners.add(scanner)
        return scanner

    async def latest_message_id(self) -> MessageId | None:
        end = self._log.end_seq
        return MemoryMessageId(end - 1) if end else None

    async def last_timetick(self) -> int:
        return timetick_of(self._log.last_record) if self._log.last_record else 0

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        """The first record with a tick >= ``timetick`` (binary search: ticks grow in
        log order); the newest record if there is none."""
        log = self._log
        records = log.records
        if not records:
            return DeliverPolicy.all()
        first = bisect.bisect_left(records, timetick, key=timetick_of)
        if first == 0:
            return DeliverPolicy.all()
        return DeliverPolicy.start_from(
            MemoryMessageId(log.first_seq + min(first, len(records) - 1))
        )

    async def truncate(self, message_id: MessageId) -> None:
        self._check_writer()
        log = self._log
        seq = _seq_of(message_id)
        if seq >= log.end_seq:
            raise InvalidArgument(f"cannot truncate through {message_id!r}: not appended yet")
        drop = seq + 1 - log.first_seq
        if drop > 0:
            log.records.drop_front(drop)
            log.first_seq += drop

    def subscriptions(self) -> MemorySubscriptionStore:
        """Process-wide like the log: a WAL reopened on the same URL sees them."""
        if self._subscriptions is None:
            self._subscriptions = MemorySubscriptionStore(self._location, self.pchannel)
        return self._subscriptions

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for scanner in list(self._scanners):
            await scanner.aclose()


@final
class _MemoryScanner(BackendScanner):
    __slots__ = ("_backend", "_closed", "_next_seq", "_selected", "_waiter")

    reports_position = True

    def __init__(self, backend: MemoryBackend, start: int, selected: Filter) -> None:
        self._backend = backend
        self._next_seq = start
        self._selected = selected
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        log = self._backend._log
        while True:
            if self._closed:
                raise WALClosed("scanner is closed")
            seq = self._next_seq
            if seq < log.first_seq:
                raise WALTruncated(
                    f"memory WAL {self._backend.pchannel!r}: position {seq} was truncated;"
                    f" the log starts at {log.first_seq}"
                )
            if seq < log.end_seq:
                # A step at a time (see _budget): a record costs DECODE_COST units,
                # decoded or not (the memory log's records are decoded whole).
                budget = await turn()
                if self._closed or seq < log.first_seq:
                    continue  # (raises at the top)
                end = min(log.end_seq, seq + STEP // DECODE_COST)
                out: list[ImmutableMessage] = []
                base = log.first_seq
                records = log.records.run(seq - base, end - base)
                for at, record in enumerate(records, seq):
                    out += decode_run(record, at, MemoryMessageId, self._selected)
                self._next_seq = end
                budget.spend((end - seq) * DECODE_COST)
                if out:
                    return out
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            log.waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                log.waiters.discard(waiter)

    def position(self) -> MessageId | None:
        seq = self._next_seq
        return MemoryMessageId(seq - 1) if seq else None

    async def aclose(self) -> None:
        self._closed = True
        self._backend._scanners.discard(self)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _seq_of(message_id: MessageId | None) -> int:
    if not isinstance(message_id, MemoryMessageId):
        raise InvalidArgument(f"{message_id!r} is not a memory:// message id")
    return message_id.seq


backend_class = MemoryBackend


# ---------------------------------------------------------------------------------------
# Subscriptions

_stored_subscriptions: Final[dict[tuple[str, str], dict[str, StoredSubscription]]] = {}


@final
class MemorySubscriptionStore(SubscriptionStore):
    """Subscriptions of a ``memory://`` pchannel. Like the memory logs they live for the
    life of the process, keyed by (location, pchannel), so a WAL reopened on the same URL
    sees them."""

    __slots__ = ("_stored",)

    def __init__(self, location: str, pchannel: str) -> None:
        super().__init__(("memory", location, pchannel))
        self._stored = _stored_subscriptions.setdefault((location, pchannel), {})

    async def _load(self, name: str) -> StoredSubscription | None:
        return self._stored.get(name)

    async def _save(self, name: str, stored: StoredSubscription) -> None:
        self._stored[name] = stored

    async def _delete(self, name: str) -> None:
        self._stored.pop(name, None)

    async def _names(self) -> list[str]:
        return list(self._stored)
