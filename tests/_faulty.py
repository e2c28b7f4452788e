"""A memory backend whose appends and reads fail on command (``faultymem://NAME``):
fault injection for the interceptor and node tests, where a real backend cannot be made
to fail on cue."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, ClassVar

import walsvc
from walsvc import DeliverPolicy, Filter, ImmutableMessage, MessageId
from walsvc.backends import Backend, BackendScanner
from walsvc.backends._memory import MemoryBackend, MemoryMessageId
from walsvc.backends._subscriptions import SubscriptionStore

SCHEME = "faultymem"
NOW_SCHEME = "faultynow"
_MODULE = "_walsvc_test_faulty_backend"
#: How long the read faults "timeout" and "stall" wait before they fail.
READ_TIMEOUT = 1.2
STALL = 0.2


class Gate:
    """Where a faulty scanner waits for the test: ``reached`` is set once one arrived,
    ``opened`` (set by the test) lets it pass."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def passed(self) -> None:
        self.reached.set()
        await self.opened.wait()


class FaultyBackend(Backend):
    """Delegates to a memory backend. ``faults`` (shared, per pchannel) is a list of what
    the next appends do: "unavailable" (raise BackendUnavailable, write nothing),
    "lost-ack" (write, then raise OSError: the outcome is unknown to the WAL),
    "lost-write" (raise OSError without writing), or "ok"."""

    faults: ClassVar[dict[str, list[str]]] = {}
    unreadable: ClassVar[set[str]] = set()
    #: Per pchannel, what the next batches of its scanners do: "unavailable" (raise
    #: BackendUnavailable), "timeout" or "stall" (the same after ``READ_TIMEOUT`` or
    #: ``STALL`` seconds, as a broker's read timing out), "gated" (the same once the
    #: test opens the pchannel's ``read_gates`` gate) or "ok" (return one message);
    #: none: scanners as usual.
    read_faults: ClassVar[dict[str, list[str]]] = {}
    read_gates: ClassVar[dict[str, Gate]] = {}
    #: Per pchannel, a gate the close of its faulty scanners waits at.
    close_gates: ClassVar[dict[str, Gate]] = {}
    message_id_class = MemoryMessageId
    scheme = SCHEME

    def __init__(self, inner: MemoryBackend) -> None:
        self._inner = inner
        self.pchannel = inner.pchannel
        self.term = inner.term
        self.read_only = inner.read_only

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> Backend:
        inner = await MemoryBackend.open(
            location,
            pchannel,
            read_only=read_only,
            options=options,
            max_message_size=max_message_size,
        )
        return cls(inner)

    def append(self, records: Sequence[bytes]) -> Awaitable[Sequence[MessageId]]:
        plan = self.faults.get(self.pchannel)
        fault = plan.pop(0) if plan else "ok"
        return self._append(records, fault)

    async def _append(self, records: Sequence[bytes], fault: str) -> Sequence[MessageId]:
        if fault == "unavailable":
            raise walsvc.BackendUnavailable("injected: broker unreachable")
        if fault == "lost-write":
            raise OSError("injected: connection reset before the write")
        ids = await self._inner.append(records)
        if fault == "lost-ack":
            raise OSError("injected: connection reset before the ack")
        return ids

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        if self.pchannel in self.unreadable:
            raise walsvc.BackendUnavailable("injected: cannot read")
        scanner = self._inner.read(deliver, selected)
        plan = self.read_faults.get(self.pchannel)
        if plan is None:
            return scanner
        gates = (self.read_gates.get(self.pchannel), self.close_gates.get(self.pchannel))
        return _FaultyScanner(scanner, plan, *gates)

    async def latest_message_id(self) -> MessageId | None:
        return await self._inner.latest_message_id()

    async def last_timetick(self) -> int:
        return await self._inner.last_timetick()

    async def truncate(self, message_id: MessageId) -> None:
        await self._inner.truncate(message_id)

    def subscriptions(self) -> SubscriptionStore:
        return self._inner.subscriptions()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _FaultyScanner(BackendScanner):
    """A scanner that follows ``plan`` (``FaultyBackend.read_faults``) one message at a
    time, then goes on as ``inner``."""

    def __init__(
        self,
        inner: BackendScanner,
        plan: list[str],
        gate: Gate | None,
        close_gate: Gate | None,
    ) -> None:
        self._inner = inner
        self._plan = plan
        self._gate = gate
        self._close_gate = close_gate
        self._held: list[ImmutableMessage] = []

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        fault = self._plan.pop(0) if self._plan else None
        if fault == "timeout":
            await asyncio.sleep(READ_TIMEOUT)
        elif fault == "stall":
            await asyncio.sleep(STALL)
        elif fault == "gated":
            assert self._gate is not None, "a gated read fault needs a gate in read_gates"
            await self._gate.passed()
        if fault in ("unavailable", "timeout", "stall", "gated"):
            raise walsvc.BackendUnavailable("injected: the read failed")
        if not self._held:
            self._held = list(await self._inner.next_batch())
        if fault is None:
            batch, self._held = self._held, []
            return batch
        return [self._held.pop(0)]

    async def aclose(self) -> None:
        if self._close_gate is not None:
            await self._close_gate.passed()
        await self._inner.aclose()


class ImmediateFaultyBackend(FaultyBackend):
    """``FaultyBackend`` with ``immediate_acks`` (``faultynow://NAME``): the faults come
    from ``append_now``, which the WAL calls for single plain appends."""

    scheme = NOW_SCHEME
    immediate_acks = True

    def append_now(self, records: Sequence[bytes]) -> Sequence[MessageId]:
        plan = self.faults.get(self.pchannel)
        fault = plan.pop(0) if plan else "ok"
        if fault == "unavailable":
            raise walsvc.BackendUnavailable("injected: broker unreachable")
        if fault == "lost-write":
            raise OSError("injected: connection reset before the write")
        ids = self._inner.append_now(records)
        if fault == "lost-ack":
            raise OSError("injected: connection reset before the ack")
        return ids


def register() -> None:
    """Make ``faultymem://`` and ``faultynow://`` known (idempotent)."""
    for scheme, backend_class in ((SCHEME, FaultyBackend), (NOW_SCHEME, ImmediateFaultyBackend)):
        if scheme in walsvc.known_schemes():
            continue
        name = f"{_MODULE}_{scheme}"
        module = types.ModuleType(name)
        module.backend_class = backend_class  # type: ignore[attr-defined]
        sys.modules[name] = module
        walsvc.register_backend(scheme, name)
