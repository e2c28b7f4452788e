"""What the ``walsvc`` subcommands share: the usage error, argument types and the event
loop they run on."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
from collections.abc import Callable

__all__ = ("UsageError", "event_loop", "int_at_least")


class UsageError(Exception):
    """An argument that cannot work; reported as ``error: <message>`` (exit status 2)."""


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return parse


def event_loop() -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """uvloop when it is installed (the ``uvloop`` extra), else the stock asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop, "asyncio"
    return uvloop.new_event_loop, f"uvloop {importlib.metadata.version('uvloop')}"
