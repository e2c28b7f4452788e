"""Header-only message filters, as data: a conjunction of vchannels, types and a timetick
floor. Being data rather than code, a filter composes with ``&``, pickles (Spark tasks),
and lets a backend test raw record headers without decoding payloads.

The rules are stated here once and enforced by ``Filter.admits`` and ``Filter.prefilter``:
- a message with an empty vchannel (a broadcast) passes every vchannel filter;
- system messages (timeticks, txn control) pass every type filter;
- the timetick floor applies to every message.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final, TypeVar, final

from ._message import SYSTEM_TYPES, ImmutableMessage

__all__ = ("Filter", "vchannel_hash")

_T = TypeVar("_T")


def vchannel_hash(vchannel_utf8: bytes) -> int:
    """The 32-bit hash stored in each record header: CRC-32 of the UTF-8 name, 0 for ""."""
    return zlib.crc32(vchannel_utf8) if vchannel_utf8 else 0


@final
class Filter:
    """Admit messages whose vchannel is in ``vchannels`` (None: any), whose type is in
    ``types`` (None: any) and whose timetick is at least ``min_timetick``."""

    __slots__ = (
        "_vchannel_hashes",
        "_vchannel_set",
        "_vchannels_utf8",
        "min_timetick",
        "types",
        "vchannels",
    )

    def __init__(
        self,
        *,
        vchannels: Iterable[str] | None = None,
        types: Iterable[int] | None = None,
        min_timetick: int = 0,
    ) -> None:
        if isinstance(vchannels, (str, bytes)) or isinstance(types, (str, bytes)):
            raise TypeError(
                "vchannels and types take a collection (e.g. vchannels=['v1']), not a string"
            )
        self.vchannels: Final = frozenset(vchannels) if vchannels is not None else None
        if self.vchannels is not None and not all(type(v) is str for v in self.vchannels):
            raise TypeError(f"vchannel names must be str: {sorted(map(repr, self.vchannels))}")
        if types is not None:
            types = tuple(types)  # may be a one-shot iterator; it is walked twice below
        if types is not None and not all(isinstance(t, int) for t in types):
            raise TypeError(f"message types must be ints (walsvc.MessageType): {types!r}")
        self.types: Final = frozenset(int(t) for t in types) if types is not None else None
        if type(min_timetick) is not int:
            raise TypeError(f"min_timetick must be an int, not {type(min_timetick).__name__}")
        self.min_timetick: Final = min_timetick
        self._vchannel_set = None if self.vchannels is None else self.vchannels | {""}
        self._vchannels_utf8 = (
            None if self.vchannels is None else frozenset(v.encode() for v in self.vchannels)
        )
        self._vchannel_hashes = (
            None
            if self._vchannels_utf8 is None
            else frozenset(vchannel_hash(v) for v in self._vchannels_utf8) | {0}
        )

    @classmethod
    def everything(cls) -> Filter:
        """The filter that admits every message."""
        return _EVERYTHING

    @classmethod
    def combine(cls, filters: Iterable[Filter]) -> Filter:
        """The conjunction of ``filters`` (``everything()`` for none)."""
        result = _EVERYTHING
        for f in filters:
            if not isinstance(f, Filter):
                raise TypeError(f"filters must be walsvc.Filter objects, got {f!r}")
            result = result & f
        return result

    @property
    def vchannel_hashes(self) -> frozenset[int] | None:
        """The header hashes ``prefilter`` accepts (broadcast's 0 included), or None."""
        return self._vchannel_hashes

    @property
    def vchannels_only(self) -> bool:
        """True if only the vchannel set restricts this filter (the common, fastest case)."""
        return self.vchannels is not None and self.types is None and self.min_timetick <= 0

    @property
    def is_everything(self) -> bool:
        """True if this filter admits every message."""
        return self.vchannels is None and self.types is None and self.min_timetick <= 0

    @property
    def is_floor_only(self) -> bool:
        """True if only ``min_timetick`` restricts this filter (a read from a tick on)."""
        return self.vchannels is None and self.types is None and self.min_timetick > 0

    def __and__(self, other: Filter) -> Filter:
        if self.is_everything:
            return other
        if other.is_everything:
            return self
        return Filter(
            vchannels=_intersect(self.vchannels, other.vchannels),
            types=_intersect(self.types, other.types),
            min_timetick=max(self.min_timetick, other.min_timetick),
        )

    def prefilter(self, type_: int, vchannel_hash_: int, timetick: int) -> bool:
        """Cheap test on raw header fields. False means the message is certainly rejected;
        True means ``admits`` must still confirm it (the vchannel hash may collide)."""
        hashes = self._vchannel_hashes
        if hashes is not None and vchannel_hash_ not in hashes:
            return False
        types = self.types
        if types is not None and type_ not in types and type_ not in SYSTEM_TYPES:
            return False
        return timetick >= self.min_timetick

    def admits(self, message: ImmutableMessage) -> bool:
        """The exact test on a decoded message."""
        return self.admits_fields(message.vchannel, message.type, message.timetick)

    def admits_fields(self, vchannel: str, type_: int, timetick: int) -> bool:
        """The exact test on a message's vchannel, type and timetick (decoded or not)."""
        vset = self._vchannel_set
        if vset is not None and vchannel not in vset:
            return False
        types = self.types
        if types is not None and type_ not in types and type_ not in SYSTEM_TYPES:
            return False
        return timetick >= self.min_timetick

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Filter):
            return NotImplemented
        return (self.vchannels, self.types, self.min_timetick) == (
            other.vchannels,
            other.types,
            other.min_timetick,
        )

    def __hash__(self) -> int:
        return hash((self.vchannels, self.types, self.min_timetick))

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_rebuild, (self.vchannels, self.types, self.min_timetick))

    def __repr__(self) -> str:
        parts = []
        if self.vchannels is not None:
            parts.append(f"vchannels={sorted(self.vchannels)!r}")
        if self.types is not None:
            parts.append(f"types={sorted(self.types)!r}")
        if self.min_timetick:
            parts.append(f"min_timetick={self.min_timetick}")
        return f"Filter({', '.join(parts)})"


def _rebuild(
    vchannels: frozenset[str] | None, types: frozenset[int] | None, min_timetick: int
) -> Filter:
    return Filter(vchannels=vchannels, types=types, min_timetick=min_timetick)


def _intersect(a: frozenset[_T] | None, b: frozenset[_T] | None) -> frozenset[_T] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


_EVERYTHING: Final = Filter()
