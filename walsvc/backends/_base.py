"""The small interface every backend implements (the shape of Milvus's walimpls).

A backend stores opaque envelopes (read them with ``walsvc.abc.decode``,
``decode_run`` and ``timetick_of``) for one pchannel; everything
else (validation, timeticks, interceptors, filters' semantics) lives above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import InvalidArgument
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import ImmutableMessage
from walsvc.core._metrics import WALMetrics

if TYPE_CHECKING:
    from walsvc.backends._subscriptions import SubscriptionStore

__all__ = ("Backend", "BackendScanner", "EnvelopeRun", "RunScanner")


class BackendScanner(ABC):
    """Messages of one pchannel in log order, from a start position, filtered."""

    __slots__ = ()

    #: True if ``position`` reports how far the scanner got; a scanner that does not
    #: report it still works, but hands off to the WAL's tail cache only once it has
    #: delivered a message the cache holds.
    reports_position: ClassVar[bool] = False

    def position(self) -> MessageId | None:
        """The newest id this scanner is done with: every message at or before it was
        returned by ``next_batch``, rejected by the filter, or lies before the start
        position. None if nothing is behind the scanner (it starts at the log's first
        record). Meaningful only when ``reports_position`` is True."""
        return None

    @abstractmethod
    async def next_batch(self) -> Sequence[ImmutableMessage]:
        """The next one or more messages, waiting until there is at least one.

        Raises ``WALClosed`` once the scanner or its backend is closed, and
        ``CorruptRecord`` if stored bytes fail their checks.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Stop the scanner; a pending ``next_batch`` raises ``WALClosed``. Idempotent."""


class EnvelopeRun(NamedTuple):
    """Stored envelopes laid end to end in ``data[start:]``; the first has sequence number
    ``first_seq`` and each next one the next number."""

    first_seq: int
    data: memoryview
    start: int


class RunScanner(Protocol):
    """Every record of a log from a start position as runs of raw envelopes, unfiltered
    and undecoded, in log order (see ``Backend.read_runs``)."""

    async def next_runs(self) -> list[EnvelopeRun]:
        """The next one or more runs, waiting until there is one. Raises as
        ``BackendScanner.next_batch`` does."""
        ...

    async def aclose(self) -> None:
        """Stop the scanner. Idempotent."""
        ...


class Backend(ABC):
    """One pchannel of one log store, opened read-only or read-write.

    Opening read-write fences every earlier writer of the pchannel: their appends raise
    ``WALFenced`` from then on. ``term`` is this writer's term, greater than every earlier
    writer's (0 when read-only).
    """

    __slots__ = ()

    #: The URL scheme this backend serves, e.g. ``"file"``.
    scheme: ClassVar[str]
    #: The id class of the messages this backend stores.
    message_id_class: ClassVar[type[MessageId]]
    #: False if records may be stored out of timetick order (appends from several
    #: writers without one serialization point); scanners then hold messages until a
    #: TimeTick confirms them. walsvc's own WAL writes in tick order on every backend.
    ticks_in_log_order: ClassVar[bool] = True
    #: True if appends are durable when the call returns (the memory log): the backend
    #: then implements ``append_now``, and the WAL appends each message as it comes;
    #: otherwise it gathers concurrent appends into one batch per loop iteration.
    immediate_acks: ClassVar[bool] = False
    #: False if ``append`` never raises a retriable error (the memory log). The default
    #: chain ``open_wal`` builds then leaves out ``Redo``, which has nothing to retry.
    retriable_appends: ClassVar[bool] = True

    pchannel: str
    read_only: bool
    term: int

    @classmethod
    @abstractmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> Backend:
        """Open ``pchannel`` at ``location`` (the URL after ``scheme://``).

        ``options`` are the backend's own keyword options; unknown ones raise
        ``TypeError``, bad values ``InvalidArgument``. ``max_message_size`` is the WAL's
        limit on one encoded envelope (the WAL refuses larger ones before they reach the
        backend): a backend whose store has its own limit sizes it to hold this.
        """

    @abstractmethod
    def append(self, records: Sequence[bytes]) -> Awaitable[Sequence[MessageId]]:
        """Queue envelopes for appending and return an awaitable of their ids.

        The call itself is the serialization point: records of successive calls land in
        the log in call order, and the records of one call land contiguously. The
        awaitable resolves once the records are durable as the backend promises.
        Raises (through the awaitable) ``WALFenced``, ``WALClosed``,
        ``BackendUnavailable`` (retriable: none of the records was stored; the WAL's
        ``Redo`` retries it) or ``AppendOutcomeUnknown`` (some may have been stored: the
        store cannot tell, so nothing retries blindly).
        """

    def record_into(self, metrics: WALMetrics) -> None:
        """Add the backend's own figures (a file log's commits, bytes written and
        segment rollovers) to ``metrics`` from now on; the WAL calls it once, at open,
        when metrics are on. By default the backend has none of its own."""
        return None

    def append_now(self, records: Sequence[bytes]) -> Sequence[MessageId]:
        """``append`` for a backend with ``immediate_acks``: the records are durable when
        it returns their ids (no awaitable). It raises what ``append``'s awaitable would.
        Backends without ``immediate_acks`` do not implement it."""
        raise NotImplementedError(f"{self.scheme}:// appends are not acknowledged at once")

    @abstractmethod
    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        """A scanner from ``deliver`` yielding the messages ``selected`` admits.

        ``deliver`` is a backend policy: ``all``, ``latest``, ``start_from`` or
        ``start_after`` (the WAL turns ``from_checkpoint`` into ``start_from`` its
        last-confirmed id, or ``all``, and drops older ticks itself). A backend that decodes
        on the event loop should do it a step at a time under ``walsvc.abc.turn`` (the
        per-loop read budget), so no call holds the loop long."""

    @abstractmethod
    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended (even if since truncated),
        or None if nothing was ever appended."""

    @abstractmethod
    async def last_timetick(self) -> int:
        """The greatest timetick ever appended to the pchannel (0 if none), truncated
        messages included: the floor a new writer's ticks must stay above."""

    @abstractmethod
    async def truncate(self, message_id: MessageId) -> None:
        """Drop every message up to and including ``message_id``. Readers asking for a
        dropped position get ``WALTruncated``."""

    def begin_close(self) -> None:
        """The WAL is closing: appends already queued, and those the WAL still drains,
        get the backend's close bound from now on (a broker backend's ``close_timeout``)
        instead of its request timeouts. ``aclose`` follows. The default does nothing:
        a backend whose appends cannot hang needs no bound. Idempotent."""
        return

    @abstractmethod
    async def aclose(self) -> None:
        """Finish queued appends, stop scanners and release resources. Idempotent."""

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        """A deliver policy whose read includes every retained message with a timetick at
        or above ``timetick`` (it may include older ones too: readers filter by tick).

        Recovery on open (the dedup window, which covers the newest ``max_age`` of the
        log) reads from here instead of from the start, so its cost follows the window,
        not the retained log. Timeticks grow with log order, so a backend finds the place
        by a search over its positions. The default, ``DeliverPolicy.all()``, is correct
        and reads everything retained; a backend that can seek should.
        """
        return DeliverPolicy.all()

    def read_runs(self, deliver: DeliverPolicy) -> RunScanner | None:
        """Optional: a backend whose ids are sequence numbers and that stores envelopes
        end to end may return a ``RunScanner`` from ``deliver``, for readers that decode
        headers column-wise (the Spark source); None (the default) means it does not."""
        return None

    def subscriptions(self) -> SubscriptionStore:
        """The durable store of this pchannel's named subscriptions (their checkpoints),
        the same object on every call. Backends without one raise ``InvalidArgument``."""
        raise InvalidArgument(f"{self.scheme}:// WALs have no durable subscriptions")
