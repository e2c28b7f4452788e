"""Producer fences: a reconnected producer's old connection appends nothing more.

A client names its WAL handle's producer when it opens a pchannel writable (``OpenWal``'s
``producer`` and ``epoch``, protocol version 3): a random id per ``RemoteWAL``, and how
many times that WAL has been opened (1, then one more per reconnect). When a producer
opens again with a higher epoch, the handle of its earlier opening is fenced: the
session that holds it refuses every later request on it (``WALFenced``). So requests of
a connection the client gave up on, which a half-open link or a proxy may still deliver
to the node, never land after the client asked what became of them (``Recall``) and
sent them again: once fenced, the old connection can only have appended what the
window or the log already shows. An opening with a lower epoch than the one that holds
the producer is itself refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from walsvc.core._errors import WALFenced

if TYPE_CHECKING:
    from ._session import Session

__all__ = ("ProducerFences",)


@final
class ProducerFences:
    """The latest opening of each producer on a node: its epoch, session and handle."""

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        self._holders: dict[str, tuple[int, Session, int]] = {}

    def __len__(self) -> int:
        return len(self._holders)

    def claim(self, producer: str, epoch: int, session: Session, handle: int) -> None:
        """Make ``session``'s ``handle`` the one ``producer`` appends through, fencing the
        handle of its earlier opening; raise ``WALFenced`` if a later opening (a higher
        epoch) holds it already."""
        held = self._holders.get(producer)
        if held is not None:
            held_epoch, holder, held_handle = held
            if held_epoch > epoch:
                raise WALFenced(
                    f"producer {producer!r} opened this WAL again (epoch {held_epoch});"
                    f" this opening (epoch {epoch}) is stale"
                )
            if (holder, held_handle) != (session, handle):
                holder.fence(
                    held_handle,
                    f"producer {producer!r} reconnected (epoch {epoch}): this connection"
                    f" (epoch {held_epoch}) may append no more",
                )
        self._holders[producer] = (epoch, session, handle)
        session.producers.add(producer)

    def release(self, session: Session) -> None:
        """Forget the producers whose latest opening is ``session``'s (it closed)."""
        for producer in session.producers:
            held = self._holders.get(producer)
            if held is not None and held[1] is session:
                del self._holders[producer]
        session.producers.clear()
