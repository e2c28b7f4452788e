"""Durable subscriptions on the node: a client's ``ack`` applied to the node's scanner of
its stream, and a stream's scanner closed with its checkpoint's outcome kept.

The node's scanner (``LocalWAL.read(subscription=...)``) holds the subscription: its
claim (one reader per name, across every client of the node, since the node's store
claims per process), its checkpoint writer and scope. A client's ``Ack`` is applied
when it arrives, in order with the connection's other messages, so a ``Flush`` after it
writes it; its failure (a failed background checkpoint write, as ``note`` raises it) is
sent back as ``AckFailed``. Closing the connection closes the scanner, which writes the
last acknowledged checkpoint and releases the name.
"""

from __future__ import annotations

from walsvc.core._deliver import Checkpoint
from walsvc.core._ids import unmarshal_message_id
from walsvc.read._scanner import LocalScanner
from walsvc.remote._protocol import Ack

__all__ = ("acknowledge", "close_scanner")


def acknowledge(scanner: LocalScanner, ack: Ack) -> None:
    """Apply the client's ``ack`` to ``scanner`` (``LocalScanner.ack``'s checks and
    effect); raises what that raises."""
    lc = None if ack.checkpoint_id is None else unmarshal_message_id(ack.checkpoint_id)
    scanner.acknowledge(Checkpoint(lc, ack.checkpoint_tick), ack.timetick)


async def close_scanner(scanner: LocalScanner) -> Exception | None:
    """Close ``scanner`` (its subscription's last checkpoint written, the name released)
    and return what the close raised, instead of raising it."""
    try:
        await scanner.aclose()
    except Exception as exc:
        return exc
    return None
