"""How much reading one iteration of an event loop may do.

Every read path that decodes records on the event loop (file scanners, the Kafka and
Pulsar scanners, the memory backend, the tail cache, the interceptors' reads) works in
steps. Work is counted in units that follow time (about 40 ns each here): decoding a
record costs ``DECODE_COST``, stepping over a record whose header a filter rejects costs
``HEADER_COST`` in Python and ``SKIP_COST`` in the compiled walk of a vchannel filter
(``_speedups.match_hashes``, a few ns a header). Before each step a reader awaits
``turn()``, which yields to the loop while the units spent on the running loop in its
current iteration (by every reader of that loop) reach ``ITERATION``; the step spends at
most ``STEP`` units (at least one record) and the reader then ``spend``s them.

The count starts again from a callback: the first ``spend`` after a reset schedules one
with ``call_soon``, which runs in the next iteration. Readers queued ahead of it in that
iteration still see the old count, so one iteration runs less than
``2 * (ITERATION + STEP)`` units (1,280 records decoded), however many readers catch up at
once; appends, timers and other tasks of the loop run between them.

Measured (bench_loop_stall, uvloop): ten scanners catching up over a 1M-message log
while 64 producers append held the loop up to 157 ms in one iteration when each decoded
a whole 1 MiB block (about 7,000 records) at once; with these steps, 3.4 ms.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Final, final

__all__ = (
    "CACHED_COST",
    "DECODE_COST",
    "HEADER_COST",
    "ITERATION",
    "SKIP_COST",
    "STEP",
    "ReadBudget",
    "budget",
    "turn",
)

#: What decoding one record costs, in units: about 2.5 us in Python (the compiled decode
#: takes a quarter of that; it is charged the same, so that a step is bounded whichever
#: decodes).
DECODE_COST: Final = 64
#: What a record costs whose header a filter rejects in Python: about 0.3 us.
HEADER_COST: Final = 8
#: What a record costs whose header the compiled walk of a vchannel filter rejects (it
#: takes 5-10 ns: a step of a 1-of-16 read examines 1,600 records, not the 700 it would
#: at ``HEADER_COST``, and its fixed costs, a loop turn and a delivery, weigh less).
SKIP_COST: Final = 1
#: What an entry of the tail cache costs a reader, in units: nothing is decoded, but the
#: scanner's stages and its consumer handle it.
CACHED_COST: Final = 16
#: Units one reader spends in one step at most: 128 records decoded, 1,024 headers
#: rejected in Python, or 8,192 in the compiled walk.
STEP: Final = 128 * DECODE_COST
#: Units all readers of one event loop spend in one loop iteration before each further
#: step waits for the next iteration (512 records decoded).
ITERATION: Final = 4 * STEP


@final
class ReadBudget:
    """The records taken on one event loop in its current iteration."""

    __slots__ = ("__weakref__", "_loop", "_resetting", "taken", "yields")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._resetting = False
        #: Records taken in the current iteration.
        self.taken = 0
        #: How many times a reader yielded because the iteration's budget was spent.
        self.yields = 0

    def spend(self, records: int) -> None:
        """Count ``records`` decoded in this iteration."""
        self.taken += records
        if not self._resetting:
            self._resetting = True
            self._loop.call_soon(self._reset)

    def _reset(self) -> None:
        self._resetting = False
        self.taken = 0

    @property
    def spent(self) -> bool:
        """True if the current iteration has no budget left."""
        return self.taken >= ITERATION


_budgets: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadBudget]] = (
    weakref.WeakKeyDictionary()
)


def budget() -> ReadBudget:
    """The budget of the running event loop."""
    loop = asyncio.get_running_loop()
    found = _budgets.get(loop)
    if found is None:
        found = _budgets[loop] = ReadBudget(loop)
    return found


async def turn() -> ReadBudget:
    """The running loop's budget, once its current iteration has some left (yielding to
    the loop until then): the caller decodes at most ``STEP`` records, then ``spend``s
    them."""
    current = budget()
    while current.spent:
        current.yields += 1
        await asyncio.sleep(0)
    return current
