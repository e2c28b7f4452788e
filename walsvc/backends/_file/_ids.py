"""Ids of the local log."""

from __future__ import annotations

from typing import final

from walsvc.core._ids import SequenceMessageId

__all__ = ("FileMessageId",)


@final
class FileMessageId(SequenceMessageId, frozen=True, gc=False):
    """Position in a ``file://`` log: a dense sequence number from 0."""

    scheme = "file"
