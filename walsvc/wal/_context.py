"""The WAL as its interceptors see it: ``InterceptorContext`` over one ``WAL``.

A friend of ``walsvc.wal._wal.WAL``: it reads and updates the writer's state (ticks and the
last-confirmed pins of its ``SerializationPoint``, tick listeners, the tail cache) that
the WAL keeps private from everybody else.

The context refers to its WAL weakly. The WAL holds its interceptors and they hold the
context, so a strong reference back would make every WAL a reference cycle: a closed
WAL, with its dedup window, its tail cache and its log's state, would outlive its last
reference until the cycle collector's next pass over its generation (a pass of 1.1-1.7 s
over a closed WAL with a million-key window, measured with ``bench_dedup_stall``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, final

from walsvc.core._chain import InterceptorContext, TickListener
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALClosed, WALReadOnly
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId
from walsvc.core._message import NO_PROPERTIES, AppendResult, ImmutableMessage, Message, MessageType

if TYPE_CHECKING:
    from walsvc.read._scanner import Scanner

    from ._wal import LocalWAL as WAL

__all__ = ("WALContext",)

_FROM_THE_START: Final = DeliverPolicy.all()


@final
class WALContext(InterceptorContext):
    """The WAL as its interceptors see it (see ``InterceptorContext``)."""

    __slots__ = ("_ref",)

    def __init__(self, wal: WAL) -> None:
        self._ref = weakref.ref(wal)

    @property
    def _wal(self) -> WAL:
        """The WAL; ``WALClosed`` once it is gone (dropped without ``aclose``)."""
        wal = self._ref()
        if wal is None:
            raise WALClosed("the WAL was dropped without aclose()")
        return wal

    @property
    def pchannel(self) -> str:
        return self._wal.pchannel

    @property
    def term(self) -> int:
        return self._wal.term

    @property
    def closed(self) -> bool:
        wal = self._ref()
        return wal is None or wal._closed

    def last_tick(self) -> int:
        return self._wal._point.last_tick

    def data_tick(self) -> int:
        return self._wal._point.data_tick

    def last_confirmed_id(self) -> MessageId | None:
        return self._wal._point.last_confirmed_id()

    def pin_last_confirmed(self) -> object:
        token = object()
        point = self._wal._point
        point.pins[token] = point.last_confirmed_id()
        return token

    def unpin(self, token: object) -> None:
        self._wal._point.pins.pop(token, None)

    async def append_system(self, message: Message) -> AppendResult:
        # Allowed while the WAL closes: interceptors finish their writes (rollbacks) in
        # their aclose, before the backend is released.
        wal = self._wal
        if wal._backend.read_only:
            raise WALReadOnly(f"WAL {wal.pchannel!r} was opened read-only")
        return await wal._point.serialize(message)

    def publish_idle_tick(self) -> int:
        wal = self._wal
        point = wal._point
        tick = wal._allocator.allocate()
        point.last_tick = tick
        last_acked = point.last_acked
        if wal._cache is not None and last_acked is not None:
            wal._cache.publish_idle_tick(
                ImmutableMessage(
                    last_acked,
                    tick,
                    "",
                    MessageType.TIME_TICK,
                    b"",
                    NO_PROPERTIES,
                    self.last_confirmed_id(),
                    None,
                    None,
                    wal.term,
                    False,
                    (),
                    point.last_acked_tick,
                )
            )
        self.notify_tick(tick)
        return tick

    def notify_tick(self, tick: int) -> None:
        for listener in list(self._wal._tick_listeners):
            listener(tick)

    def add_tick_listener(self, listener: TickListener) -> None:
        wal = self._wal
        if listener not in wal._tick_listeners:
            wal._tick_listeners.append(listener)
            wake = wal._point.on_activity
            if wake is not None:
                wake()

    def remove_tick_listener(self, listener: TickListener) -> None:
        try:
            self._wal._tick_listeners.remove(listener)
        except ValueError:
            pass

    def has_tick_listeners(self) -> bool:
        wal = self._wal
        # A scanner waiting only for data (its pipeline drops idle ticks) is not a
        # listener: an idle tick would wake it for nothing.
        cache = wal._cache
        return bool(wal._tick_listeners) or (cache is not None and cache.has_tick_waiters())

    def wake_on_activity(self, wake: Callable[[], object] | None) -> None:
        # Messages wake it at the serialization point, scanners waiting for idle ticks
        # in the tail cache, listeners in add_tick_listener (which asks the point's).
        wal = self._wal
        wal._point.on_activity = wake
        if wal._cache is not None:
            wal._cache.on_activity = wake

    def read(
        self, deliver: DeliverPolicy = _FROM_THE_START, filters: Iterable[Filter] = ()
    ) -> Scanner:
        return self._wal.read(deliver, filters, raw=True)

    async def latest_message_id(self) -> MessageId | None:
        return await self._wal.latest_message_id()

    async def last_durable_timetick(self) -> int:
        return await self._wal._backend.last_timetick()

    async def start_at_timetick(self, timetick: int) -> DeliverPolicy:
        return await self._wal._backend.start_at_timetick(timetick)
