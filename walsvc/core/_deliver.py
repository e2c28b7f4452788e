"""Where a scanner starts reading, and the checkpoint a reader resumes from."""

from __future__ import annotations

from typing import Literal

import msgspec

from ._errors import CorruptRecord
from ._ids import MessageId, unmarshal_message_id

__all__ = ("Checkpoint", "DeliverPolicy")


class Checkpoint(msgspec.Struct, frozen=True):
    """A resume point: (last-confirmed id, timetick) of the last message a reader handled.

    Reading from ``DeliverPolicy.from_checkpoint(c)`` delivers exactly the messages with a
    timetick greater than ``c.timetick`` (transactions committed later included, since
    the last-confirmed id is at or before every transaction open at that message).
    ``ImmutableMessage.checkpoint`` gives a message's checkpoint.
    """

    last_confirmed_id: MessageId | None
    timetick: int

    def marshal(self) -> str:
        """Text form ``"<timetick>@<marshalled id>"`` (``"<timetick>@"`` without an id),
        round-tripped by ``Checkpoint.unmarshal``."""
        lc = self.last_confirmed_id
        return f"{self.timetick}@{'' if lc is None else lc.marshal()}"

    @classmethod
    def unmarshal(cls, text: str) -> Checkpoint:
        """Parse ``marshal()``'s output; raise ``CorruptRecord`` if it is not one."""
        tick, sep, lc = text.partition("@")
        if not sep or not (tick.isascii() and tick.isdigit()):
            raise CorruptRecord(f"{text!r} is not a marshalled checkpoint")
        return cls(unmarshal_message_id(lc) if lc else None, int(tick))


class DeliverPolicy(msgspec.Struct, frozen=True):
    """Where a scanner starts: ``all()`` (the earliest retained message), ``latest()``
    (only messages appended after the scanner was created), ``start_from(id)`` (inclusive),
    ``start_after(id)`` (exclusive) or ``from_checkpoint(c)`` (exactly the messages after
    checkpoint ``c``). Identical on every backend."""

    kind: Literal["all", "latest", "start_from", "start_after", "checkpoint"]
    message_id: MessageId | None = None
    #: For ``checkpoint``: deliver only messages with a greater timetick.
    after_timetick: int = 0

    @classmethod
    def all(cls) -> DeliverPolicy:
        """Start at the earliest message the log still retains."""
        return _ALL

    @classmethod
    def latest(cls) -> DeliverPolicy:
        """Deliver only messages appended after the scanner was created."""
        return _LATEST

    @classmethod
    def start_from(cls, message_id: MessageId) -> DeliverPolicy:
        """Start at ``message_id``, inclusive."""
        return cls("start_from", _checked(message_id))

    @classmethod
    def start_after(cls, message_id: MessageId) -> DeliverPolicy:
        """Start just after ``message_id``."""
        return cls("start_after", _checked(message_id))

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> DeliverPolicy:
        """Resume after ``checkpoint``: read from its last-confirmed id (the start of the
        log if it has none) and deliver only messages with a greater timetick."""
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"from_checkpoint takes a walsvc.Checkpoint, not {checkpoint!r}")
        lc = checkpoint.last_confirmed_id
        return cls("checkpoint", None if lc is None else _checked(lc), checkpoint.timetick)

    def backend_policy(self) -> DeliverPolicy:
        """The policy a backend serves: ``checkpoint`` becomes ``start_from`` its id (or
        ``all``); the timetick part is applied above the backend."""
        if self.kind != "checkpoint":
            return self
        return _ALL if self.message_id is None else DeliverPolicy("start_from", self.message_id)


def _checked(message_id: MessageId) -> MessageId:
    if not isinstance(message_id, MessageId):
        raise TypeError(f"expected a walsvc.MessageId, not {message_id!r}")
    return message_id


_ALL = DeliverPolicy("all")
_LATEST = DeliverPolicy("latest")
