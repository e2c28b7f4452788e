"""Where a read must start to include every message from a timetick on (see
``PulsarBackend.start_at_timetick``): a binary search over the entries of the topic's
last ledger, with readers created at the entries it probes.

Valid messages carry increasing timeticks in log order; validity is the chain rule (see
``_records``), which a reader can apply from any position once it has read one message
to anchor on. A probe at entry ``m`` reads from there to the first valid message (a
group that starts after the anchor) and takes its tick: the probe's answer only grows
with ``m``. The search finds the last entry ``m`` whose probe finds a tick below the
target, then reads on from it to the first valid message at or above the target; the
policy is ``start_after`` the last valid message below the target, so a read from it
delivers nothing below the target (``start_from`` it if there is none at or above the
target: a read from it then still holds the newest message of the log). About
log2(entries) probes of about one group each, and one short read.

Readers only go forward and ids are per ledger, so earlier ledgers are not searched: a
target at or below the first valid tick of the last ledger gives ``all`` (correct, and
the read then covers the earlier ledgers too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import BackendUnavailable

from ._client import Client
from ._ids import PulsarMessageId
from ._log import ForwardRead, last_entry
from ._records import ChainValidator, Link

__all__ = ("start_at_timetick",)

_T = TypeVar("_T")

#: Seconds a probe's reader may deliver nothing before it is replaced (``ForwardRead``'s
#: ``STALL`` for its other users): a probe reads a few thousand messages from a position
#: known to hold them, which take milliseconds to arrive, and Pulsar Lite now and then
#: stops serving a reader (seen in about one search in three on a 500k-message log).
_PROBE_STALL = 1.0


async def start_at_timetick(
    client: Client, topic: str, operation_timeout: float, timetick: int
) -> DeliverPolicy:
    """A deliver policy whose read includes every valid message of ``topic`` with a
    timetick at or above ``timetick`` (see the module docstring). Each step is bounded
    by ``operation_timeout`` (``BackendUnavailable``)."""
    reads = ForwardRead(client, topic, operation_timeout, stall=_PROBE_STALL)
    bound = await _within(operation_timeout, last_entry(client, topic, operation_timeout), topic)
    if bound is None:
        return DeliverPolicy.all()
    ledger = bound.ledger
    lo, hi = 0, bound.entry + 1  # the probe from lo finds a tick below; from hi: nothing

    def below(entry: int) -> Awaitable[bool]:
        start = PulsarMessageId(ledger, entry)
        return _below(reads, start, bound, timetick, operation_timeout, topic)

    if not await below(lo):
        return DeliverPolicy.all()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await below(mid):
            lo = mid
        else:
            hi = mid
    last_below: PulsarMessageId | None = None
    validator = ChainValidator()

    above = False

    def consume(links: list[Link]) -> bool:
        nonlocal last_below, above
        for link in links:
            for valid in validator.push(link):
                if valid.timetick >= timetick:
                    above = True
                    return True
                last_below = valid.id
        return False

    start = PulsarMessageId(ledger, lo)
    await _within(
        operation_timeout, reads.run(start, inclusive=True, through=bound, consume=consume), topic
    )
    assert last_below is not None  # the probe from lo found one
    if above:
        return DeliverPolicy.start_after(last_below)
    return DeliverPolicy.start_from(last_below)


async def _below(
    reads: ForwardRead,
    start: PulsarMessageId,
    bound: PulsarMessageId,
    timetick: int,
    operation_timeout: float,
    topic: str,
) -> bool:
    """Whether the first valid message read from ``start`` on has a tick below
    ``timetick`` (False if there is none up to ``bound``, the topic's last entry)."""
    validator = ChainValidator()
    first: Link | None = None

    def consume(links: list[Link]) -> bool:
        nonlocal first
        for link in links:
            valid = validator.push(link)
            if valid:
                first = valid[0]
                return True
        return False

    await _within(
        operation_timeout, reads.run(start, inclusive=True, through=bound, consume=consume), topic
    )
    return first is not None and first.timetick < timetick


async def _within(seconds: float, awaitable: Awaitable[_T], topic: str) -> _T:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise BackendUnavailable(
            f"searching {topic} for a timetick took longer than {seconds} s (operation_timeout)"
        ) from None
