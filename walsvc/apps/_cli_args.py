"""What the ``walsvc`` subcommands share: the usage error and argument types."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ("UsageError", "int_at_least")


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
