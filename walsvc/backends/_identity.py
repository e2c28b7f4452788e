"""Who a writer is, in words: what a ``WALFenced`` error names so that the fenced process
learns which process took the pchannel over (as ``SubscriptionBusy`` names its holder)."""

from __future__ import annotations

import os
import socket

__all__ = ("this_writer",)


def this_writer() -> str:
    """``"pid 1234 on host-a"``: this process, as a fenced writer's error names it."""
    return f"pid {os.getpid()} on {socket.gethostname()}"
