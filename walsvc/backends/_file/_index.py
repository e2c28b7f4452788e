"""A sparse in-memory index of frame positions, for seeking to a sequence number.

Entries are added as frames are written or walked, at most one per ``INTERVAL`` bytes of a
segment, so a seek reads at most about ``INTERVAL`` bytes more than it must.
"""

from __future__ import annotations

import bisect
from typing import Final

__all__ = ("SparseIndex",)

INTERVAL: Final = 64 * 1024


class SparseIndex:
    """For each segment, sorted (first sequence number, file offset) of some frames."""

    __slots__ = ("_segments",)

    def __init__(self) -> None:
        self._segments: dict[int, tuple[list[int], list[int]]] = {}

    def note(self, segment: int, seq: int, offset: int) -> None:
        """Record that the frame starting at ``offset`` of ``segment`` begins at ``seq``."""
        entry = self._segments.get(segment)
        if entry is None:
            self._segments[segment] = ([seq], [offset])
            return
        seqs, offsets = entry
        if seq > seqs[-1] and offset - offsets[-1] >= INTERVAL:
            seqs.append(seq)
            offsets.append(offset)

    def floor(self, segment: int, seq: int) -> tuple[int, int]:
        """The (seq, offset) of a frame at or before ``seq`` in ``segment``; (segment, 0)
        when nothing closer is known."""
        entry = self._segments.get(segment)
        if entry is None:
            return segment, 0
        seqs, offsets = entry
        i = bisect.bisect_right(seqs, seq) - 1
        if i < 0:
            return segment, 0
        return seqs[i], offsets[i]

    def forget(self, segment: int) -> None:
        """Drop what is known about a deleted segment."""
        self._segments.pop(segment, None)
