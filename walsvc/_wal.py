"""The WAL users hold: a backend plus validation, timetick assignment and scanners.

The path of an append: ``append`` checks the WAL is writable, then in one synchronous
step allocates the timetick, encodes the envelope and hands it to the backend, whose
``append`` call is the serialization point. Log order therefore equals timetick order
(the invariant is enforced here, by doing those three things with no ``await`` between
them).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Final, final

from ._codec import HEADER_SIZE, encode
from ._deliver import DeliverPolicy
from ._errors import MessageTooLarge, WALClosed, WALReadOnly
from ._filter import Filter
from ._ids import MessageId
from ._message import AppendResult, Message
from ._scanner import Scanner
from ._timetick import TimetickAllocator
from .backends import Backend

__all__ = ("DEFAULT_MAX_MESSAGE_SIZE", "WAL")

#: Default largest encoded message, as in Milvus (5 MiB).
DEFAULT_MAX_MESSAGE_SIZE: Final = 5 * 1024 * 1024
_FROM_THE_START: Final = DeliverPolicy.all()


@final
class WAL:
    """One pchannel of a write-ahead log, opened with ``walsvc.open_wal``.

    Appends return once the message is durable as the backend promises, with the id and
    timetick it got; timeticks strictly increase in log order. Reads return scanners.
    A read-only WAL raises ``WALReadOnly`` on appends and truncation; every call on a
    closed WAL raises ``WALClosed``; a fenced WAL (a newer writer opened the pchannel)
    raises ``WALFenced`` on appends.
    """

    __slots__ = (
        "_allocator",
        "_backend",
        "_closed",
        "_max_message_size",
        "_scanners",
        "_term",
        "_writable",
    )

    def __init__(
        self, backend: Backend, *, allocator: TimetickAllocator, max_message_size: int
    ) -> None:
        self._backend = backend
        self._allocator = allocator
        self._max_message_size = max_message_size
        self._closed = False
        self._writable = not backend.read_only
        self._term = backend.term
        self._scanners: set[Scanner] = set()

    @property
    def pchannel(self) -> str:
        """The physical channel this WAL writes and reads."""
        return self._backend.pchannel

    @property
    def read_only(self) -> bool:
        """True if the WAL was opened read-only."""
        return self._backend.read_only

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called."""
        return self._closed

    @property
    def term(self) -> int:
        """This writer's term (0 when read-only); every message it appends carries it."""
        return self._backend.term

    @property
    def backend(self) -> Backend:
        """The backend underneath (for backend-specific tools and tests)."""
        return self._backend

    def _check_writable(self) -> None:
        if self._writable:
            return
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        if self._backend.read_only:
            raise WALReadOnly(f"WAL {self.pchannel!r} was opened read-only")

    def _encode(self, message: Message) -> tuple[bytes, int]:
        if not isinstance(message, Message):
            raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
        if len(message.payload) + HEADER_SIZE > self._max_message_size:
            raise MessageTooLarge(
                f"message payload of {len(message.payload)} bytes exceeds max_message_size"
                f" {self._max_message_size}"
            )
        tick = self._allocator.allocate()
        record = encode(message, timetick=tick, term=self._term)
        if len(record) > self._max_message_size:
            raise MessageTooLarge(
                f"encoded message of {len(record)} bytes exceeds max_message_size"
                f" {self._max_message_size}"
            )
        return record, tick

    async def append(self, message: Message) -> AppendResult:
        """Append one message; return its id and timetick once it is durable."""
        self._check_writable()
        record, tick = self._encode(message)
        # Nothing may await between _encode (which allocates the tick) and the backend
        # call (the serialization point): that keeps log order equal to tick order.
        ids = await self._backend.append((record,))
        return AppendResult(ids[0], tick)

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages contiguously, in order; return their results once all are
        durable. If one is invalid or too large, none is appended."""
        self._check_writable()
        encoded = [self._encode(m) for m in messages]
        if not encoded:
            return []
        ids = await self._backend.append([record for record, _ in encoded])
        return [AppendResult(i, tick) for i, (_, tick) in zip(ids, encoded, strict=True)]

    def read(
        self, deliver: DeliverPolicy = _FROM_THE_START, filters: Iterable[Filter] = ()
    ) -> Scanner:
        """A scanner from ``deliver`` over the messages every filter admits."""
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        if not isinstance(deliver, DeliverPolicy):
            raise TypeError(f"deliver must be a walsvc.DeliverPolicy, not {deliver!r}")
        scanner = Scanner(
            self._backend.read(deliver, Filter.combine(filters)), self._scanners.discard
        )
        self._scanners.add(scanner)
        return scanner

    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended (even if since truncated),
        or None if nothing was ever appended."""
        if self._closed:
            raise WALClosed(f"WAL {self.pchannel!r} is closed")
        return await self._backend.latest_message_id()

    async def truncate(self, message_id: MessageId) -> None:
        """Drop every message up to and including ``message_id``."""
        self._check_writable()
        await self._backend.truncate(message_id)

    async def aclose(self) -> None:
        """Finish queued appends, close every scanner (their reads raise ``WALClosed``) and
        release the backend. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._writable = False
        scanners, self._scanners = self._scanners, set()
        for scanner in scanners:
            await scanner._close_for_wal()
        await self._backend.aclose()

    async def __aenter__(self) -> WAL:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        mode = "ro" if self.read_only else f"rw term={self.term}"
        state = " closed" if self._closed else ""
        return f"<walsvc.WAL {self._backend.scheme}:{self.pchannel} {mode}{state}>"
