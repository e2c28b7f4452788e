"""Who a writer is, in words: what a ``WALFenced`` error names so that the fenced process
learns which process took the pchannel over (as ``SubscriptionBusy`` names its holder).

The brokers carry it on the record that fences: a read-write open's barrier holds
``this_writer()`` under ``WRITER`` (a Kafka header, a Pulsar property). It is a hint for
people, never read for correctness: a barrier without it (an older writer's) fences all
the same, and ``named_writer`` turns anything unreadable into None."""

from __future__ import annotations

import os
import socket
from typing import Final

__all__ = ("WRITER", "named_writer", "this_writer")

#: The key of a barrier's header (Kafka) or property (Pulsar) that names its writer.
WRITER: Final = "walsvc.writer"
#: The longest name repeated in an error; anything longer is not one walsvc wrote.
_LONGEST: Final = 300


def this_writer() -> str:
    """``"pid 1234 on host-a"``: this process, as a fenced writer's error names it."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


def named_writer(value: str | bytes | None) -> str | None:
    """The writer a barrier's ``WRITER`` value names, or None if there is none or it is
    not readable text (never raises)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value or len(value) > _LONGEST or not value.isprintable():
        return None
    return value
