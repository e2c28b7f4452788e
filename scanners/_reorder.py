"""The reorder buffer: messages leave in timetick order, each exactly once.

walsvc allocates timeticks where appends are serialized, so on its own backends log
order already is timetick order and every message confirms its own tick (``ordered``):
messages pass straight through, and the buffer only checks them. A log whose order can
differ from tick order (``ordered=False``: another writer's tick allocation, a merged
source) is held in a min-heap on tick and released up to each TimeTick, which promises
that no later message carries a smaller tick (Milvus's reorder buffer).

Either way a message is rejected (not delivered, counted in ``rejected``) if its tick is
at or below a tick already released, or if its writer term is older than a term already
seen: that is a fenced writer's late append, which the newer writer's recovery did not
see (Milvus issue #53368).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from typing import final

from walsvc.core._message import ImmutableMessage, MessageType

__all__ = ("ReorderBuffer",)

_log = logging.getLogger("walsvc.scanners")


@final
class ReorderBuffer:
    """Timetick order for one scanner (see the module docstring)."""

    __slots__ = ("_heap", "_ordered", "_pushed", "_released", "_term", "rejected")

    def __init__(self, *, ordered: bool = True) -> None:
        self._ordered = ordered
        self._released = -1  # the greatest tick released
        self._term = 0  # the greatest writer term seen
        self._heap: list[tuple[int, int, ImmutableMessage]] = []
        self._pushed = 0
        #: Messages rejected as tick regressions or stale-term appends.
        self.rejected = 0

    @property
    def held(self) -> int:
        """How many messages wait for a TimeTick (always 0 when ``ordered``)."""
        return len(self._heap)

    def push(self, batch: Sequence[ImmutableMessage]) -> Sequence[ImmutableMessage]:
        """Take ``batch`` (log order) and return the messages released, in tick order."""
        if self._ordered:
            released, term = self._released, self._term
            for message in batch:  # the common case: a check per message, no copy
                if message.timetick <= released or message.term < term:
                    return self._push_checked(batch)
                released, term = message.timetick, message.term
            self._released, self._term = released, term
            return batch
        return self._push_held(batch)

    def admit(self, timetick: int, term: int) -> bool:
        """For a reader that checks raw headers instead of pushing messages (ordered
        buffers only): True, and remembered as released, if a message with these fields
        would pass; False otherwise, and nothing changes (push that message to have it
        rejected, counted and logged)."""
        if not self._ordered:
            raise ValueError("admit is for ordered reorder buffers")
        if term < self._term or timetick <= self._released:
            return False
        self._released, self._term = timetick, term
        return True

    def _push_checked(self, batch: Sequence[ImmutableMessage]) -> list[ImmutableMessage]:
        out = []
        for message in batch:
            if self._accepts(message):
                self._released = message.timetick
                out.append(message)
        return out

    def _push_held(self, batch: Sequence[ImmutableMessage]) -> list[ImmutableMessage]:
        out: list[ImmutableMessage] = []
        heap = self._heap
        for message in batch:
            if not self._accepts(message):
                continue
            if message.type is MessageType.TIME_TICK:
                tick = message.timetick
                while heap and heap[0][0] <= tick:
                    out.append(heapq.heappop(heap)[2])
                self._released = tick
                out.append(message)
            else:
                self._pushed += 1
                heapq.heappush(heap, (message.timetick, self._pushed, message))
        return out

    def _accepts(self, message: ImmutableMessage) -> bool:
        if message.term < self._term:
            self._reject(message, f"its writer term {message.term} is older than {self._term}")
            return False
        self._term = message.term
        if message.timetick <= self._released:
            self._reject(message, f"its timetick {message.timetick} is not above {self._released}")
            return False
        return True

    def _reject(self, message: ImmutableMessage, why: str) -> None:
        self.rejected += 1
        _log.warning("scanner rejected message %r: %s", message.message_id, why)
