"""Message ids: totally ordered positions within one pchannel, marshalled to text.

Every backend defines its own id class (a ``MessageId`` subclass); ids of different
backends never compare. ``marshal()`` gives ``"<scheme>:<position>"`` and
``unmarshal_message_id`` turns that text back into the backend's id class, loading the
backend lazily through the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import msgspec

from ._errors import CorruptRecord, UnknownBackend

if TYPE_CHECKING:
    from typing import Self

__all__ = ("MessageId", "SequenceMessageId", "resolve_schemes_with", "unmarshal_message_id")


class MessageId:
    """A position in one pchannel's log, totally ordered within that pchannel.

    Subclasses are frozen msgspec Structs, so ``==`` and ``hash`` are exact and cheap, and
    define ``<``, ``<=``, ``>``, ``>=``. Ordering ids of different backends raises
    ``TypeError``.
    """

    __slots__ = ()

    #: The URL scheme of the backend that issues these ids; the prefix of ``marshal()``.
    scheme: ClassVar[str]

    if TYPE_CHECKING:

        def __lt__(self, other: Self) -> bool: ...
        def __le__(self, other: Self) -> bool: ...
        def __gt__(self, other: Self) -> bool: ...
        def __ge__(self, other: Self) -> bool: ...
        def __hash__(self) -> int: ...

    def marshal(self) -> str:
        """Text form ``"<scheme>:<position>"``, round-tripped by ``unmarshal_message_id``."""
        raise NotImplementedError

    @classmethod
    def from_position(cls, text: str) -> Self:
        """Parse the part of ``marshal()`` after the scheme; raise ``CorruptRecord`` if bad."""
        raise NotImplementedError


class SequenceMessageId(msgspec.Struct, MessageId, frozen=True):
    """An id that is a dense, zero-based sequence number (local log, memory, Kafka offset).

    Ids compare only with ids of the same class; ``==`` and ``hash`` come from msgspec.
    """

    seq: int

    def __lt__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.seq < other.seq

    def __le__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.seq <= other.seq

    def __gt__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.seq > other.seq

    def __ge__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.seq >= other.seq

    def marshal(self) -> str:
        return f"{self.scheme}:{self.seq}"

    @classmethod
    def from_position(cls, text: str) -> Self:
        if not (text.isascii() and text.isdigit()):  # isdigit alone admits "²" and "٣"
            raise CorruptRecord(f"{text!r} is not a {cls.scheme} message position")
        return cls(int(text))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.seq})"


def unmarshal_message_id(text: str) -> MessageId:
    """Parse the output of ``MessageId.marshal()`` back into the backend's id class.

    Raises ``CorruptRecord`` if the text is not a marshalled id, and ``UnknownBackend`` if
    no backend is registered for its scheme.
    """
    scheme, sep, position = text.partition(":")
    if not sep or not scheme:
        raise CorruptRecord(f"{text!r} is not a marshalled message id (expected 'scheme:pos')")
    if _id_class_of is None:
        raise UnknownBackend(f"no backend registry is loaded to read {scheme}:// ids")
    return _id_class_of(scheme).from_position(position)


#: Maps a URL scheme to its backend's id class; installed by the backend registry
#: (``walsvc.backends._registry``), which sits above this module and loads backends.
_id_class_of: Callable[[str], type[MessageId]] | None = None


def resolve_schemes_with(id_class_of: Callable[[str], type[MessageId]]) -> None:
    """Make ``unmarshal_message_id`` find a scheme's id class with ``id_class_of`` (which
    raises ``UnknownBackend`` for a scheme without a backend). The backend registry calls
    this when it is imported."""
    global _id_class_of
    _id_class_of = id_class_of
