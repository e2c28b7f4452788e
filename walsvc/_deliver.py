"""Where a scanner starts reading."""

from __future__ import annotations

from typing import Literal

import msgspec

from ._ids import MessageId

__all__ = ("DeliverPolicy",)


class DeliverPolicy(msgspec.Struct, frozen=True):
    """Where a scanner starts: ``all()`` (the earliest retained message), ``latest()``
    (only messages appended after the scanner was created), ``start_from(id)`` (inclusive)
    or ``start_after(id)`` (exclusive). Identical on every backend."""

    kind: Literal["all", "latest", "start_from", "start_after"]
    message_id: MessageId | None = None

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
        return cls("start_from", message_id)

    @classmethod
    def start_after(cls, message_id: MessageId) -> DeliverPolicy:
        """Start just after ``message_id``."""
        return cls("start_after", message_id)


_ALL = DeliverPolicy("all")
_LATEST = DeliverPolicy("latest")
