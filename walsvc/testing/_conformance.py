"""``check_backend``: the conformance battery every walsvc backend passes.

Adapted from Milvus's ``pkg/streaming/walimpls/test_framework.go`` and run through the
``walsvc.WAL`` users hold, so it checks the backend together with the layer above it.
Per pchannel, concurrently over several fresh pchannels (steps 1 to 4:
``_pchannel_check.py``):

1. Three terms. Each opens read-write, appends from concurrent producers (``append`` and
   ``append_many``) while two scanners tail from ``DeliverPolicy.all()`` until the term's
   final message; checks the reads against everything ever written; checks
   ``start_from``/``start_after`` seeks and that ``latest()`` waits for new messages;
   closes; reopens read-only, reads everything and is refused writes.
2. Fencing: a second read-write open fences the first writer.
3. Closing: scanners and calls on a closed WAL.
4. Truncation, durable across reopen, including truncating the whole log.
5. Exactly-once (``_exactly_once.py``): keyed appends, batches and transactions retried
   after cancellations and across a reopen land once; ``start_at_timetick``.

These read the log as the backend returns it (``raw=True, use_cache=False``). Then, on one
more pchannel, the scanner battery (``_scanner_conformance.py``) checks what readers see:
filters, every deliver policy, transaction visibility, checkpoint resume and durable
subscriptions, and the hand-off from the backend to the tail cache.

Messages the kit did not write are tolerated only if they are system messages (a WAL may
write timeticks of its own): they take part in the ordering checks and are otherwise
ignored. Every failure is an ``AssertionError`` naming the pchannel, the step and what
differed.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from walsvc.core._errors import InvalidArgument
from walsvc.wal._api import WAL

from ._exactly_once import ExactlyOnceCheck
from ._instruments import task_group
from ._pchannel_check import PChannelCheck
from ._scanner_conformance import ScannerCheck

__all__ = ("check_backend", "check_truncation")


async def check_backend(
    open_wal_for: Callable[..., Awaitable[WAL]],
    *,
    message_count: int = 1000,
    pchannels: int = 3,
    hang_after: float = 60.0,
    truncation: bool = True,
    exactly_once: bool = True,
) -> None:
    """Run the conformance battery against the backend behind ``open_wal_for``.

    ``open_wal_for(pchannel, read_only=...)`` must open (each time anew) the given
    pchannel of one and the same log, e.g.
    ``lambda p, *, read_only: walsvc.open_wal(url, p, read_only=read_only)``. The kit uses
    ``pchannels`` fresh, randomly named pchannels concurrently and appends
    ``message_count`` messages per pchannel in each of three terms.

    Returns if the backend behaves as walsvc promises: reads in strictly increasing id
    order equal to what was acknowledged, exact seeks, a ``latest()`` that waits,
    read-only opens that read but refuse writes, ids and timeticks that keep increasing
    across reopens, fencing of an earlier writer, ``WALClosed`` after closing,
    truncation that no read can see past, and the scanner battery (filters, deliver
    policies, transactions, checkpoints and subscriptions, tail-cache hand-off).
    Raises ``AssertionError`` saying what differed otherwise; a step (one read, one
    append, one open) that takes longer than ``hang_after`` seconds counts as a hang and
    fails too. ``truncation=False`` leaves out the truncation step, for a backend whose
    store cannot truncate (a documented deviation; run ``check_truncation`` apart, e.g.
    as a strict xfail). ``exactly_once=False`` leaves out the exactly-once step, which
    needs the default interceptor chain (``interceptors.Dedup``) behind ``open_wal_for``.
    Every WAL the kit opens is closed before it returns or raises.
    """
    if message_count < 2:
        raise InvalidArgument(f"message_count must be at least 2, not {message_count!r}")
    if pchannels < 1:
        raise InvalidArgument(f"pchannels must be at least 1, not {pchannels!r}")
    if not hang_after > 0:
        raise InvalidArgument(f"hang_after must be positive, not {hang_after!r}")
    run = uuid.uuid4().hex[:12]
    async with task_group() as tg:
        for i in range(pchannels):
            check = PChannelCheck(open_wal_for, f"conformance-{i}-{run}", message_count, hang_after)
            tg.create_task(check.run(truncation=truncation))
    # Only on a backend that passed the battery above: what readers see through it.
    await ScannerCheck(open_wal_for, f"conformance-scanners-{run}", hang_after).run()
    if exactly_once:
        await ExactlyOnceCheck(open_wal_for, f"conformance-keys-{run}", hang_after).run()


async def check_truncation(
    open_wal_for: Callable[..., Awaitable[WAL]], *, hang_after: float = 60.0
) -> None:
    """The truncation step of ``check_backend`` alone, on one fresh pchannel: ``truncate``
    hides every id up to and including its argument from every read, durably, and
    truncating the whole log leaves a log that reopens and keeps counting."""
    if not hang_after > 0:
        raise InvalidArgument(f"hang_after must be positive, not {hang_after!r}")
    pchannel = f"conformance-truncation-{uuid.uuid4().hex[:12]}"
    await PChannelCheck(open_wal_for, pchannel, 2, hang_after).truncation()
