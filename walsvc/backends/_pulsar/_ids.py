"""Ids of the ``pulsar://`` backend: a Pulsar MessageId, totally ordered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import msgspec

from walsvc.core._errors import CorruptRecord
from walsvc.core._ids import MessageId

if TYPE_CHECKING:
    from typing import Self

__all__ = ("PulsarMessageId",)


@final
class PulsarMessageId(msgspec.Struct, MessageId, frozen=True, gc=False):
    """A position in one pchannel's Pulsar topic: (ledger, entry, batch index, partition).

    Ordered by (ledger, entry, batch index), which is Pulsar's storage order within one
    non-partitioned topic. ``batch`` is -1 for a message stored alone (not in a batch);
    ``partition`` is -1 for a non-partitioned topic (walsvc's pchannel topics are).
    ``marshal()`` gives ``"pulsar:LEDGER:ENTRY:BATCH:PARTITION"``.
    """

    ledger: int
    entry: int
    batch: int = -1
    partition: int = -1

    scheme = "pulsar"

    def _key(self) -> tuple[int, int, int]:
        return (self.ledger, self.entry, self.batch)

    def __lt__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: Self) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() >= other._key()

    def marshal(self) -> str:
        return f"pulsar:{self.ledger}:{self.entry}:{self.batch}:{self.partition}"

    @classmethod
    def from_position(cls, text: str) -> Self:
        parts = text.split(":")
        if len(parts) != 4:
            raise CorruptRecord(f"{text!r} is not a pulsar message position")
        try:
            ledger, entry, batch, partition = (_int(part) for part in parts)
        except ValueError:
            raise CorruptRecord(f"{text!r} is not a pulsar message position") from None
        if ledger < 0 or entry < 0 or batch < -1 or partition < -1:
            raise CorruptRecord(f"{text!r} is not a pulsar message position")
        return cls(ledger, entry, batch, partition)

    @classmethod
    def of(cls, pulsar_id: Any) -> PulsarMessageId:
        """The id of a ``pulsar.MessageId`` / ``_pulsar.MessageId``."""
        return cls(
            pulsar_id.ledger_id(),
            pulsar_id.entry_id(),
            pulsar_id.batch_index(),
            pulsar_id.partition(),
        )

    def __repr__(self) -> str:
        return f"PulsarMessageId({self.ledger}, {self.entry}, {self.batch}, {self.partition})"


def _int(text: str) -> int:
    body = text[1:] if text.startswith("-") else text
    if not (body.isascii() and body.isdigit()):
        raise ValueError(text)
    return int(text)
