"""Which pchannel holds a vchannel: ``Routing``, a versioned, stable hash mapping.

The mapping named ``"jump-blake2b-v1"`` sends vchannel ``v`` to ``pchannels[i]`` where::

    key = int.from_bytes(blake2b(v.encode("utf-8"), digest_size=8).digest(), "big")
    b, j = -1, 0
    while j < len(pchannels):
        b = j
        key = (key * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    i = b

That is: BLAKE2b (RFC 7693) with an 8-byte digest (the ``digest_size`` parameter, no key,
salt or personalization) of the vchannel's UTF-8 bytes, read as an unsigned big-endian
64-bit integer, fed to jump consistent hash (Lamping & Veach, arXiv:1406.2294) exactly as
published, the division and multiplication in IEEE-754 double precision and the result
truncated to an integer. It depends on nothing but the name and the number of pchannels,
so every process, Python version and machine agrees; adding a pchannel at the end of the
list moves only about 1/n of the vchannels, all of them to the new pchannel.

Pins place vchannels by hand: a routing with pins sends each pinned vchannel to its
pinned pchannel and every other one by its hash. Such a routing stores its ``hash`` as
``"pinned+"`` followed by the hash's name (``"pinned+jump-blake2b-v1"``): a walsvc that
predates pins does not know that name and refuses the stored routing (``CorruptRecord``)
instead of ignoring the pins and sending pinned vchannels elsewhere.

No hash spreads a handful of vchannels evenly: a function of the name and the number of
pchannels alone places each name independently, so 10 names over 4 pchannels leave one
pchannel empty about 22% of the time whatever the hash (jump-blake2b-v1 on random names:
22.0% of 20,000 draws). An even spread needs the set of names: ``balanced_pins``
computes the fewest pins that give it.

``plan_reads`` turns the routing history into the stretches of pchannel logs that hold a
vchannel's messages (used by ``Node.read``); none of the above does I/O. The functions at
the end keep the routing versions in the backend itself: msgspec JSON messages in the
pchannel ``walsvc.routing``, oldest first, the newest in force.
"""

from __future__ import annotations

import hashlib
import itertools
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgspec

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    CorruptRecord,
    InvalidArgument,
    RoutingMismatch,
    WALFenced,
    WALTruncated,
)
from walsvc.core._filter import Filter
from walsvc.core._message import Message
from walsvc.core._timetick import TimetickAllocator
from walsvc.remote._open import open_wal
from walsvc.wal._api import WAL
from walsvc.wal._wal import LocalWAL

__all__ = (
    "HASHES",
    "ROUTING_PCHANNEL",
    "Cut",
    "Routing",
    "Stretch",
    "balanced_pins",
    "jump_blake2b_v1",
    "load_routings",
    "mismatch",
    "plan_reads",
    "store_routing",
    "take_cuts",
)

#: The pchannel that stores the routing versions; reserved on every backend.
ROUTING_PCHANNEL: Final = "walsvc.routing"

_MASK64: Final = (1 << 64) - 1
_LCG: Final = 2862933555777941757
_BUCKET_SCALE: Final = float(1 << 31)


def jump_blake2b_v1(vchannel: str, buckets: int) -> int:
    """The bucket in ``range(buckets)`` of ``vchannel`` under ``"jump-blake2b-v1"`` (the
    module docstring specifies it)."""
    digest = hashlib.blake2b(vchannel.encode("utf-8"), digest_size=8).digest()
    key = int.from_bytes(digest, "big")
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * _LCG + 1) & _MASK64
        j = int((b + 1) * (_BUCKET_SCALE / float((key >> 33) + 1)))
    return b


#: The mappings this walsvc implements, by the name a ``Routing`` stores.
HASHES: Final = {"jump-blake2b-v1": jump_blake2b_v1}
_DEFAULT_HASH: Final = "jump-blake2b-v1"
#: The prefix of a pinned routing's stored ``hash`` (see the module docstring).
_PINNED: Final = "pinned+"


class Cut(msgspec.Struct, frozen=True):
    """Where one pchannel's log stood when a routing version was installed: its newest
    message (``message_id`` marshalled, None if the log was empty), with that message's
    vchannel and timetick. Messages at or before the cut belong to earlier versions."""

    pchannel: str
    message_id: str | None
    vchannel: str = ""
    timetick: int = 0


class Routing(msgspec.Struct, frozen=True):
    """Version ``version`` of the vchannel -> pchannel mapping of a ``walsvc.Node``.

    ``pchannels`` are the buckets, in order (the order is part of the mapping); ``hash``
    names the mapping (``"jump-blake2b-v1"``, specified in ``walsvc.node._routing``). ``pins``
    are ``(vchannel, pchannel)`` pairs (a mapping is accepted too), kept sorted by
    vchannel: a pinned vchannel goes to its pchannel, which must be one of ``pchannels``,
    whatever its hash says; the broadcast vchannel ``""`` cannot be pinned. With pins,
    ``hash`` reads ``"pinned+jump-blake2b-v1"`` (set for you). Changing pins, like
    changing ``pchannels``, is a new version. Version 1 has no ``cuts``; a migration to
    version N+1 records one ``Cut`` for every pchannel of version N or N+1: each log's
    newest message once every writer of version N was fenced and before anything was
    written under version N+1. Stored as msgspec JSON in the
    backend's ``walsvc.routing`` pchannel. Raises ``InvalidArgument`` when malformed.
    """

    version: int
    pchannels: tuple[str, ...]
    hash: str = _DEFAULT_HASH
    cuts: tuple[Cut, ...] = ()
    pins: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.pchannels, list):
            msgspec.structs.force_setattr(self, "pchannels", tuple(self.pchannels))
        if type(self.version) is not int or self.version < 1:
            raise InvalidArgument(f"routing version must be an int >= 1, not {self.version!r}")
        names = self.pchannels
        if not isinstance(names, tuple) or not names or not all(type(p) is str for p in names):
            raise InvalidArgument(f"routing needs a non-empty tuple of pchannel names: {names!r}")
        if len(set(names)) != len(names):
            raise InvalidArgument(f"routing pchannels repeat a name: {list(names)}")
        base = self.hash.removeprefix(_PINNED) if isinstance(self.hash, str) else self.hash
        if base not in HASHES:
            raise InvalidArgument(
                f"routing hash {self.hash!r} is unknown to this walsvc (known: {sorted(HASHES)})"
            )
        pins = _checked_pins(self.pins, names)
        msgspec.structs.force_setattr(self, "pins", pins)
        msgspec.structs.force_setattr(self, "hash", _PINNED + base if pins else base)
        cut_names = [c.pchannel for c in self.cuts]
        if len(set(cut_names)) != len(cut_names):
            raise InvalidArgument(f"routing cuts repeat a pchannel: {cut_names}")
        if self.version > 1 and not set(names) <= set(cut_names):
            raise InvalidArgument(f"routing version {self.version} lacks the cut of a pchannel")

    def index_of(self, vchannel: str) -> int:
        """The index in ``pchannels`` of the pchannel that holds ``vchannel``."""
        if type(vchannel) is not str:
            raise InvalidArgument(f"vchannel must be str, not {type(vchannel).__name__}")
        pins = self.pins
        if pins:
            at = bisect_left(pins, (vchannel,))
            if at < len(pins) and pins[at][0] == vchannel:
                return self.pchannels.index(pins[at][1])
            return HASHES[self.hash.removeprefix(_PINNED)](vchannel, len(self.pchannels))
        return HASHES[self.hash](vchannel, len(self.pchannels))

    def pchannel_of(self, vchannel: str) -> str:
        """The pchannel that holds ``vchannel`` under this version: the same answer in every
        process, on every machine and Python version."""
        return self.pchannels[self.index_of(vchannel)]

    def cut_of(self, pchannel: str) -> Cut | None:
        """The cut this version recorded for ``pchannel`` (None for version 1, or for a
        pchannel in neither this version nor the one before)."""
        for cut in self.cuts:
            if cut.pchannel == pchannel:
                return cut
        return None


def _checked_pins(pins: object, pchannels: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``pins`` (pairs or a mapping) as a tuple of pairs sorted by vchannel, or
    ``InvalidArgument``."""
    if isinstance(pins, Mapping):
        pins = tuple(pins.items())
    if isinstance(pins, (str, bytes)) or not isinstance(pins, Iterable):
        raise InvalidArgument(f"routing pins take (vchannel, pchannel) pairs, not {pins!r}")
    pairs = []
    for pair in pins:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidArgument(f"a routing pin is a (vchannel, pchannel) pair, not {pair!r}")
        vchannel, pchannel = pair
        if type(vchannel) is not str or not vchannel:
            raise InvalidArgument(f"a pinned vchannel is a non-empty str, not {vchannel!r}")
        if pchannel not in pchannels:
            raise InvalidArgument(
                f"vchannel {vchannel!r} is pinned to {pchannel!r}, not one of {list(pchannels)}"
            )
        pairs.append((vchannel, pchannel))
    pairs.sort()
    for (a, _), (b, _) in itertools.pairwise(pairs):
        if a == b:
            raise InvalidArgument(f"routing pins name vchannel {a!r} twice")
    return tuple(pairs)


def balanced_pins(
    pchannels: Sequence[str], vchannels: Iterable[str], *, pins: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The pins that spread ``vchannels`` evenly over ``pchannels``: each pchannel gets
    ``len(vchannels) // len(pchannels)`` of them or one more, and as few vchannels as that
    allows leave the pchannel the hash (``"jump-blake2b-v1"``) gives them.

    ``pins`` stay as given: they count toward their pchannel's share and never move, so
    the spread is even only as far as they allow. The result holds ``pins``
    plus one pin per moved vchannel; pass it as ``open_node(..., pins=...)``. The same
    arguments give the same pins in every process. ``InvalidArgument`` for a bad list.
    """
    kept = dict(pins or {})
    if isinstance(vchannels, (str, bytes)):
        raise InvalidArgument(f"vchannels takes a sequence of names, not {vchannels!r}")
    names = sorted({*vchannels, *kept} - {""})  # the broadcast is on every pchannel
    probe = Routing(1, tuple(pchannels), pins=tuple(kept.items()))  # validates both
    placed: list[list[str]] = [[] for _ in probe.pchannels]
    for name in names:
        placed[probe.index_of(name)].append(name)
    n, k = len(placed), len(names)
    # The fullest pchannels (ties: the first) get the one-more shares: fewest moves.
    order = sorted(range(n), key=lambda i: (-len(placed[i]), i))
    share = [k // n] * n
    for i in order[: k % n]:
        share[i] += 1
    spare: list[str] = []
    for i in range(n):
        movable = [v for v in placed[i] if v not in kept]
        while len(placed[i]) > share[i] and movable:
            name = movable.pop()  # the last names in sorted order move
            placed[i].remove(name)
            spare.append(name)
    result = dict(kept)
    for i in range(n):
        while len(placed[i]) < share[i] and spare:
            name = spare.pop(0)
            placed[i].append(name)
            result[name] = probe.pchannels[i]
    return result


class Stretch(NamedTuple):
    """A run of one pchannel's log that holds a vchannel's messages: after the message
    ``after`` (marshalled; None: from the start) through ``until`` (None: to the live end)."""

    pchannel: str
    after: str | None
    until: Cut | None


def plan_reads(history: Sequence[Routing], vchannel: str) -> list[Stretch]:
    """The stretches that together hold every message of ``vchannel`` written under the
    routing versions ``history`` (oldest first), in order; the last one is live.

    Under version k the vchannel's messages went to ``P = history[k].pchannel_of(v)``,
    after version k's cut of P and through version k+1's cut of P. Consecutive stretches
    of one pchannel are merged; empty ones are left out.
    """
    stretches: list[Stretch] = []
    for k, routing in enumerate(history):
        pchannel = routing.pchannel_of(vchannel)
        start = routing.cut_of(pchannel)
        after = None if start is None else start.message_id
        until = history[k + 1].cut_of(pchannel) if k + 1 < len(history) else None
        last = stretches[-1] if stretches else None
        if last is not None and last.pchannel == pchannel and last.until is not None:
            if last.until.message_id == after:  # contiguous: one stretch
                stretches[-1] = Stretch(pchannel, last.after, until)
                continue
        if until is not None and until.message_id in (None, after):
            continue  # nothing was written there under version k
        stretches.append(Stretch(pchannel, after, until))
    return stretches


# -- the routing versions, stored in the backend ---------------------------------------


async def load_routings(meta: WAL) -> tuple[Routing, ...]:
    """Every routing version in ``meta`` (the ``walsvc.routing`` pchannel), oldest first."""
    latest = await meta.latest_message_id()
    if latest is None:
        return ()
    history: list[Routing] = []
    # With timeticks: the newest record may be a TimeTick (a node's chain writes them)
    async with meta.read(timeticks=True) as scanner:
        async for message in scanner:  # it would wait at the end: stop at the newest
            if message.persisted and message.vchannel == ROUTING_PCHANNEL:
                try:
                    history.append(msgspec.json.decode(message.payload, type=Routing))
                except msgspec.DecodeError as exc:
                    raise CorruptRecord(f"stored routing {message.message_id}: {exc}") from exc
            if message.message_id >= latest:
                break
    if [r.version for r in history] != list(range(1, len(history) + 1)) or any(
        new.cut_of(p) is None for old, new in itertools.pairwise(history) for p in old.pchannels
    ):
        raise CorruptRecord(f"stored routing versions are not 1, 2, ... with cuts: {history}")
    return tuple(history)


async def store_routing(meta: WAL, routing: Routing) -> None:
    """Append ``routing`` to ``meta``. ``WALFenced`` if another opener fenced ``meta``
    since it was read (it may have stored a version first): nothing was stored."""
    payload = msgspec.json.encode(routing)
    raced = WALFenced(
        f"another open_node changed the routing concurrently; version {routing.version}"
        " was not stored (open the node again)"
    )
    # The key makes two openers storing one version (over walsvc://, where the node is
    # the single writer and nothing fences) land one record; the reread tells whose.
    key = f"{ROUTING_PCHANNEL}.v{routing.version}"
    try:
        await meta.append(Message(payload=payload, vchannel=ROUTING_PCHANNEL, idempotency_key=key))
    except WALFenced as exc:
        raise raced from exc
    stored = await load_routings(meta)
    if len(stored) < routing.version or stored[routing.version - 1] != routing:
        raise raced


async def take_cuts(
    url: str, pchannels: Iterable[str], allocator: TimetickAllocator, options: Mapping[str, Any]
) -> tuple[Cut, ...]:
    """Fence the writers of ``pchannels`` and return each one's cut: a bare read-write
    open (it fences, writes nothing, and feeds the log's newest tick to ``allocator``),
    the newest message, close. A writer opened after this writes after the cut."""
    cuts = []
    for pchannel in pchannels:
        wal = await open_wal(
            url, pchannel, interceptors=[], timetick_allocator=allocator, **options
        )
        try:
            cuts.append(await _cut_of(wal))
        finally:
            await wal.aclose()
    return tuple(cuts)


async def _cut_of(wal: WAL) -> Cut:
    if not isinstance(wal, LocalWAL):
        raise InvalidArgument(
            f"migrating the routing of {wal.pchannel!r} reads its backend: it is not served"
            " over walsvc:// yet"
        )
    latest = await wal.latest_message_id()
    if latest is None:
        return Cut(wal.pchannel, None)
    # The raw backend scanner: it returns the newest record whatever it is.
    scanner = wal.backend.read(DeliverPolicy.start_from(latest), Filter.everything())
    try:
        newest = (await scanner.next_batch())[0]
    except WALTruncated:  # all truncated: any message after the cut ends the stretch
        return Cut(wal.pchannel, latest.marshal(), "", await wal.backend.last_timetick())
    finally:
        await scanner.aclose()
    return Cut(wal.pchannel, latest.marshal(), newest.vchannel, newest.timetick)


def mismatch(url: str, stored: Routing, wanted: Routing) -> RoutingMismatch:
    """The error for opening ``wanted`` (its pchannels and pins) where ``stored`` is in
    force."""
    if stored.pchannels != wanted.pchannels:
        order = " (same names, other order: the order is part of the mapping)"
        same = set(stored.pchannels) == set(wanted.pchannels)
        what = f"over pchannels {list(stored.pchannels)}, not {list(wanted.pchannels)}" + (
            order if same else ""
        )
    else:
        what = f"with pins {dict(stored.pins)}, not {dict(wanted.pins)}"
    return RoutingMismatch(
        f"the routing stored at {url} is version {stored.version} {what}; changing it is a"
        f" migration: open_node(..., migrate=True) stores version {stored.version + 1}"
    )
