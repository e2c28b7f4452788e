"""``open_node``: many pchannels of one backend behind one object that routes vchannels.

The routing (``walsvc.Routing``, stored in the backend's ``walsvc.routing`` pchannel)
says which pchannel holds a vchannel. Changing the pchannel list is an explicit migration
(``open_node(..., migrate=True)``, see ``Node``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Final, final

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import InvalidArgument, InvalidMessage, WALClosed
from walsvc.core._filter import Filter
from walsvc.core._gather import await_all
from walsvc.core._message import SYSTEM_TYPES, AppendResult, Message
from walsvc.core._timetick import HybridClock, TimetickAllocator
from walsvc.remote._open import open_wal
from walsvc.wal._api import WAL
from walsvc.wal._open import _PCHANNEL
from walsvc.write._txn import Txn

from ._node_scanner import NodeScanner
from ._routing import (
    ROUTING_PCHANNEL,
    Routing,
    Stretch,
    load_routings,
    mismatch,
    plan_reads,
    store_routing,
    take_cuts,
)

__all__ = ("Node", "open_node")

_WAL_ARGS: Final = frozenset(
    {"read_only", "max_message_size", "timetick_allocator", "interceptors"}
)
_ALL: Final = DeliverPolicy.all()
_ROUTE_CACHE: Final = 1 << 16


async def open_node(
    url: str,
    pchannels: Iterable[str],
    *,
    pins: Mapping[str, str] | None = None,
    migrate: bool = False,
    **open_wal_kwargs: Any,
) -> Node:
    """Open every pchannel of ``pchannels`` at ``url`` (concurrently) and return the
    ``Node`` that routes vchannels over them; on any failure close what was opened and
    raise.

    The first open stores routing version 1 for this list. Later opens with the same list
    (same names, same order) use the stored routing; a different list raises
    ``RoutingMismatch`` unless ``migrate=True``, which fences every writer of the old and
    new pchannels, records their cuts and stores version N+1 (see ``Node`` for what that
    means for reads); pchannels the new list drops are written no more, but replays still
    read them. A concurrent ``open_node`` that stored first makes this one raise
    ``WALFenced`` with nothing stored.

    ``pins`` (vchannel -> pchannel of ``pchannels``) place vchannels by hand; the others
    go by the hash (``walsvc.balanced_pins`` computes pins for an even spread). None (the
    default) takes the stored pins as they are (a migration keeps them; one naming a
    pchannel the new list drops raises ``InvalidArgument``); a mapping must equal the
    stored pins, or, with ``migrate=True``, replaces them in version N+1 (``{}``: no pins).

    ``open_wal_kwargs`` go to every ``walsvc.open_wal`` call, except that one timetick
    allocator serves all pchannels (a fresh ``HybridClock`` unless you pass one) and
    ``interceptors``, since an interceptor serves one WAL, is None (the default chain),
    an empty sequence, or a zero-argument callable returning a fresh chain per pchannel.
    With ``read_only=True`` the stored routing must exist and match.

    Over ``walsvc://host:port`` the node serves every pchannel (and the routing's): its
    writers own the chain, the clock (one for all its pchannels) and the size limit, so
    ``interceptors``, ``timetick_allocator`` and ``max_message_size`` raise
    ``InvalidArgument``, as does ``migrate=True`` (a migration reads each pchannel's
    backend: run it with the backend URL where the log is). Two openers storing a first
    routing at once store one; the other raises ``WALFenced``.
    """
    remote = isinstance(url, str) and url.startswith("walsvc://")
    if remote:
        _check_remote(migrate, open_wal_kwargs)
    wanted = _checked_pchannels(pchannels)
    asked = None if pins is None else Routing(1, wanted, pins=_checked_pins(pins))
    read_only = open_wal_kwargs.get("read_only", False)
    if type(migrate) is not bool or type(read_only) is not bool:
        raise InvalidArgument("migrate and read_only take a bool")
    if read_only and migrate:
        raise InvalidArgument("a read-only node cannot migrate the routing")
    # One timetick authority for all pchannels: this process's clock, or the node's.
    allocator = None if remote else open_wal_kwargs.get("timetick_allocator") or HybridClock()
    wal_kwargs = _wal_kwargs(open_wal_kwargs, allocator)
    options = {k: v for k, v in open_wal_kwargs.items() if k not in _WAL_ARGS}
    meta = await open_wal(
        url,
        ROUTING_PCHANNEL,
        read_only=read_only,
        interceptors=None if read_only or remote else [],
        **options,
    )
    try:
        history = await load_routings(meta)
        stored = history[-1] if history else None
        if stored is None:
            if read_only:
                raise InvalidArgument(f"no routing is stored at {url}; open it read-write first")
            routing = asked or Routing(1, wanted)
        elif stored.pchannels == wanted and (asked is None or asked.pins == stored.pins):
            routing = stored
        elif not migrate:
            raise mismatch(url, stored, asked or Routing(1, wanted))
        else:
            kept = stored.pins if asked is None else asked.pins
            if lost := [(v, p) for v, p in kept if p not in wanted]:
                raise InvalidArgument(
                    f"the stored pins {dict(lost)} name pchannels the new list drops;"
                    " pass pins= with the new placement"
                )
            both = dict.fromkeys([*stored.pchannels, *wanted])
            assert allocator is not None  # a migration is refused over walsvc://
            cuts = await take_cuts(url, both, allocator, options)
            routing = Routing(stored.version + 1, wanted, cuts=cuts, pins=kept)
        wals = await _open_all(url, wanted, wal_kwargs)
        try:
            if routing is not stored:
                if stored is not None:
                    dropped = [p for p in stored.pchannels if p not in wals]
                    await _seal(url, dropped, wal_kwargs)
                await store_routing(meta, routing)
                history = (*history, routing)
        except BaseException:
            await _close_all(wals.values())
            raise
    finally:
        await meta.aclose()
    return Node(url, history, wals, options)


@final
class Node:
    """Many pchannels of one backend, with vchannels routed to them by ``routing``.

    A vchannel lives on one pchannel, so its messages keep their order and ``read``
    delivers them in log order; across vchannels there is no order. ``append`` and
    ``append_many`` route by ``Message.vchannel``; ``broadcast`` writes a ``vchannel=""``
    message to every pchannel (not atomically: a failure may leave it on some; an
    idempotency key makes the retry exactly-once per pchannel).

    Migration: messages stay where they were written. ``read(v)`` with
    ``DeliverPolicy.all()`` reads v's pchannel of each routing version in turn, from that
    version's cut of it through the next version's cut, then the current pchannel to the
    live end, so a full replay loses and repeats nothing (broadcasts included). Other
    policies carry ids of one pchannel, so they read only the current pchannel.
    Every call on a closed node raises ``WALClosed``.
    """

    __slots__ = ("_closed", "_history", "_lock", "_options", "_readers", "_routes", "_url", "_wals")

    def __init__(
        self,
        url: str,
        history: Sequence[Routing],
        wals: Mapping[str, WAL],
        options: Mapping[str, Any],
    ) -> None:
        self._url = url
        self._history = tuple(history)
        self._wals = dict(wals)
        self._options = dict(options)
        self._readers: dict[str, WAL] = {}  # read-only WALs of pchannels routing dropped
        self._lock = asyncio.Lock()
        self._routes: dict[str, WAL] = {}
        self._closed = False

    @property
    def routing(self) -> Routing:
        """The routing version in force."""
        return self._history[-1]

    @property
    def history(self) -> tuple[Routing, ...]:
        """Every routing version stored, oldest first (the last one is ``routing``)."""
        return self._history

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called."""
        return self._closed

    def pchannel_of(self, vchannel: str) -> str:
        """The pchannel that holds ``vchannel`` under the current routing."""
        return self.wal_for(vchannel).pchannel

    def wal_for(self, vchannel: str) -> WAL:
        """The WAL of the pchannel that holds ``vchannel``. ``InvalidArgument`` for a
        non-str vchannel or the broadcast vchannel ``""``."""
        if self._closed:
            raise WALClosed("the node is closed")
        wal = self._routes.get(vchannel) if type(vchannel) is str else None
        if wal is None:
            if vchannel == "":
                raise InvalidArgument("vchannel '' is the broadcast: it is on every pchannel")
            wal = self._wals[self.routing.pchannel_of(vchannel)]
            if len(self._routes) >= _ROUTE_CACHE:
                self._routes.clear()
            self._routes[vchannel] = wal
        return wal

    def wal(self, pchannel: str) -> WAL:
        """The WAL of ``pchannel``, one of ``routing.pchannels``."""
        if self._closed:
            raise WALClosed("the node is closed")
        wal = self._wals.get(pchannel) if type(pchannel) is str else None
        if wal is None:
            raise InvalidArgument(f"{pchannel!r} is not one of {list(self._wals)}")
        return wal

    async def append(self, message: Message) -> AppendResult:
        """Append ``message`` to its vchannel's pchannel (see ``WAL.append``); a broadcast
        (``vchannel=""``) raises ``InvalidMessage``: use ``broadcast``."""
        return await self.wal_for(_routed(message)).append(message)

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append ``messages``, each to its vchannel's pchannel, and return their results
        in input order. Every message is checked first (one invalid: none appended); each
        pchannel's share is one ``WAL.append_many``, in input order, and the shares run
        concurrently. If one fails, the first error is raised once all finished; the
        other pchannels' shares may have been appended."""
        batch = list(messages)
        groups: dict[WAL, list[int]] = {}
        for index, message in enumerate(batch):
            _check_user_message(message)
            groups.setdefault(self.wal_for(_routed(message)), []).append(index)
        if len(groups) <= 1:
            return [] if not groups else await next(iter(groups)).append_many(batch)
        shares = await await_all(
            [w.append_many([batch[i] for i in ix]) for w, ix in groups.items()]
        )
        results: list[AppendResult | None] = [None] * len(batch)
        for indices, share in zip(groups.values(), shares, strict=True):
            for index, result in zip(indices, share, strict=True):
                results[index] = result
        return [r for r in results if r is not None]

    async def broadcast(self, message: Message) -> dict[str, AppendResult]:
        """Append ``message`` (whose vchannel must be ``""``) to every pchannel,
        concurrently; return the results by pchannel. If one fails, the first error is
        raised once all finished."""
        if self._closed:
            raise WALClosed("the node is closed")
        _check_user_message(message)
        if message.vchannel != "":
            raise InvalidMessage(f"broadcast takes vchannel '', not {message.vchannel!r}")
        results = await await_all([wal.append(message) for wal in self._wals.values()])
        return dict(zip(self._wals, results, strict=True))

    async def begin_txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> Txn:
        """``WAL.begin_txn`` on the pchannel of ``vchannel`` (a key makes it exactly-once
        there: the routing sends every retry to the same pchannel)."""
        return await self.wal_for(vchannel).begin_txn(
            vchannel, keepalive=keepalive, idempotency_key=idempotency_key
        )

    @asynccontextmanager
    async def txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> AsyncIterator[Txn]:
        """``WAL.txn`` on the pchannel of ``vchannel``: commits when the block succeeds,
        rolls back when it raises."""
        async with self.wal_for(vchannel).txn(
            vchannel, keepalive=keepalive, idempotency_key=idempotency_key
        ) as handle:
            yield handle

    def read(
        self,
        vchannel: str,
        deliver: DeliverPolicy = _ALL,
        filters: Iterable[Filter] = (),
        *,
        timeticks: bool = False,
        subscription: str | None = None,
    ) -> NodeScanner:
        """A scanner over ``vchannel``'s messages (and broadcasts) that ``filters`` admit.

        With ``DeliverPolicy.all()`` it reads every routing version's share of the
        vchannel in turn (see ``Node``); any other policy reads the current pchannel only.
        ``timeticks``: as ``WAL.read`` (ticks of the current pchannel only).

        ``subscription="name"``: a durable subscription, as ``WAL.read`` has; it lives on
        the vchannel's current pchannel (checkpoints are ids of one pchannel), so it reads
        that pchannel only. ``InvalidArgument`` if ``deliver`` is ``all()`` and the
        vchannel's history spans other pchannels (a migration moved it): those messages
        would be skipped; read them first without a subscription, then subscribe from
        ``DeliverPolicy.start_after`` the cut or ``latest()``.
        """
        wal = self.wal_for(vchannel)
        if not isinstance(deliver, DeliverPolicy):
            raise TypeError(f"deliver must be a walsvc.DeliverPolicy, not {deliver!r}")
        chosen = Filter.combine(filters)
        plan = [Stretch(wal.pchannel, None, None)]
        if deliver.kind == "all":
            history = plan_reads(self._history, vchannel)
            if subscription is None:
                plan = history
            elif len(history) > 1:
                raise InvalidArgument(
                    f"subscription {subscription!r} of vchannel {vchannel!r} reads its current"
                    f" pchannel {wal.pchannel!r} only, but the vchannel's history spans"
                    f" {sorted({s.pchannel for s in history})}: read that history without a"
                    " subscription, or subscribe from latest() or after the cut"
                )
        return NodeScanner(
            self._wals,
            self._reader,
            vchannel,
            deliver,
            chosen,
            plan,
            timeticks=timeticks,
            subscription=subscription,
        )

    async def _reader(self, pchannel: str) -> WAL:
        """A WAL to read ``pchannel`` with: the node's own, or one opened read-only."""
        if self._closed:
            raise WALClosed("the node is closed")
        wal = self._wals.get(pchannel) or self._readers.get(pchannel)
        if wal is not None:
            return wal
        async with self._lock:
            wal = self._readers.get(pchannel)
            if wal is None:
                wal = await open_wal(self._url, pchannel, read_only=True, **self._options)
                if self._closed:
                    await wal.aclose()
                    raise WALClosed("the node is closed")
                self._readers[pchannel] = wal
        return wal

    async def aclose(self) -> None:
        """Close every WAL of the node (their scanners raise ``WALClosed``); idempotent.
        Raises the first error once all are closed."""
        if self._closed:
            return
        self._closed = True
        self._routes.clear()
        await _close_all([*self._wals.values(), *self._readers.values()])

    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return (
            f"<walsvc.Node {self._url} routing v{self.routing.version} {list(self._wals)}{state}>"
        )


def _checked_pchannels(pchannels: Iterable[str]) -> tuple[str, ...]:
    if isinstance(pchannels, (str, bytes)) or not isinstance(pchannels, Iterable):
        raise InvalidArgument(f"pchannels takes a sequence of names, not {pchannels!r}")
    names = tuple(pchannels)
    if not names:
        raise InvalidArgument("a node needs at least one pchannel")
    for name in names:
        if not isinstance(name, str) or not _PCHANNEL.fullmatch(name):
            raise InvalidArgument(
                f"pchannel {name!r} must be 1-200 characters of [A-Za-z0-9._-],"
                " starting with a letter or digit"
            )
    if ROUTING_PCHANNEL in names:
        raise InvalidArgument(f"{ROUTING_PCHANNEL!r} is reserved for the routing")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"pchannels repeat a name: {list(names)}")
    return names


def _checked_pins(pins: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(pins, Mapping):
        raise InvalidArgument(f"pins takes a mapping of vchannel to pchannel, not {pins!r}")
    return tuple(pins.items())


def _check_remote(migrate: bool, kwargs: Mapping[str, Any]) -> None:
    """What ``open_node`` over ``walsvc://`` refuses: the node's writers own the chain,
    the clock and the size limit, and a migration reads each pchannel's backend."""
    if migrate:
        raise InvalidArgument(
            "migrating the routing reads each pchannel's backend: run open_node(...,"
            " migrate=True) with the node's backend URL where its log is, not over walsvc://"
        )
    owned = [k for k in ("timetick_allocator", "interceptors", "max_message_size") if k in kwargs]
    if owned:
        raise InvalidArgument(
            f"{', '.join(owned)}: the node's writers own these; set them where the node runs"
            " (walsvc serve), not on a walsvc:// client"
        )


def _wal_kwargs(
    kwargs: Mapping[str, Any], allocator: TimetickAllocator | None
) -> Callable[[], dict[str, Any]]:
    """A function giving the ``open_wal`` keyword arguments for one more pchannel
    (``allocator`` None: the node over ``walsvc://`` allocates)."""
    shared = dict(kwargs)
    if allocator is not None:
        shared["timetick_allocator"] = allocator
    chain = shared.pop("interceptors", None)
    if isinstance(chain, Sequence) and chain:
        raise InvalidArgument(
            "an interceptor serves one WAL: pass interceptors=lambda: [...] to build a chain"
            " per pchannel"
        )
    if chain is not None and not isinstance(chain, Sequence) and not callable(chain):
        raise InvalidArgument(f"interceptors takes a sequence or a callable, not {chain!r}")

    def one() -> dict[str, Any]:
        return {**shared, "interceptors": chain() if callable(chain) else chain}

    return one


async def _open_all(
    url: str, pchannels: Sequence[str], wal_kwargs: Callable[[], dict[str, Any]]
) -> dict[str, WAL]:
    opened = await asyncio.gather(
        *(open_wal(url, p, **wal_kwargs()) for p in pchannels), return_exceptions=True
    )
    wals = [w for w in opened if isinstance(w, WAL)]
    if len(wals) < len(opened):
        await _close_all(wals)
        raise next(e for e in opened if isinstance(e, BaseException))
    return dict(zip(pchannels, wals, strict=True))


async def _seal(
    url: str, pchannels: Iterable[str], wal_kwargs: Callable[[], dict[str, Any]]
) -> None:
    """Open each pchannel the routing drops with the node's chain and close it once the
    ready hooks ran: its opening TimeTick (and the rollback of any transaction left open)
    lands after the cut, where a replay sees that pchannel's stretch end."""
    for pchannel in pchannels:
        wal = await open_wal(url, pchannel, **wal_kwargs())
        try:
            await wal.wait_ready()
        finally:
            await wal.aclose()


async def _close_all(wals: Iterable[WAL]) -> None:
    await await_all([wal.aclose() for wal in wals])


def _routed(message: Message) -> str:
    if not isinstance(message, Message):
        raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
    if message.vchannel == "":
        raise InvalidMessage("vchannel '' is a broadcast: append it with Node.broadcast")
    return message.vchannel


def _check_user_message(message: Message) -> None:
    """What ``WAL.append_many`` checks, before any pchannel's share is appended."""
    if not isinstance(message, Message):
        raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
    if message.type in SYSTEM_TYPES:
        raise InvalidMessage(f"{message.type.name} messages are written by the WAL itself")
    if message.txn is not None:
        raise InvalidMessage("transaction messages are appended through Node.begin_txn")
