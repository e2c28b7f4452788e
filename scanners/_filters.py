"""Constructors of header-only filters (``walsvc.Filter`` values)."""

from __future__ import annotations

from walsvc.core._filter import Filter

__all__ = ("timetick_gt", "timetick_gte", "types", "vchannel")


def vchannel(*names: str) -> Filter:
    """Admit messages of any of the vchannels ``names`` (and broadcasts)."""
    if not names:
        raise ValueError("vchannel() needs at least one vchannel name")
    return Filter(vchannels=names)


def types(*message_types: int) -> Filter:
    """Admit messages of any of ``message_types`` (and every system message)."""
    if not message_types:
        raise ValueError("types() needs at least one message type")
    return Filter(types=message_types)


def timetick_gt(timetick: int) -> Filter:
    """Admit messages whose timetick is greater than ``timetick``."""
    return Filter(min_timetick=timetick + 1)


def timetick_gte(timetick: int) -> Filter:
    """Admit messages whose timetick is at least ``timetick``."""
    return Filter(min_timetick=timetick)
