"""What the ``walsvc`` subcommands share: the usage error, argument types and the event
loop they run on."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import math
import os
from collections.abc import Callable

__all__ = ("UsageError", "bearer_token", "event_loop", "int_at_least", "seconds")


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


def seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return value


def event_loop() -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """uvloop when it is installed (the ``uvloop`` extra), else the stock asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop, "asyncio"
    return uvloop.new_event_loop, f"uvloop {importlib.metadata.version('uvloop')}"


def bearer_token(token_file: str | None) -> str | None:
    """The bearer token of a node or its client: the first line of ``token_file`` when
    given (a secret in a file, readable only by its owner, stays out of the
    environment), else the environment variable ``WALSVC_TOKEN``; None when neither
    sets one. Never from the command line, where ``ps`` would show it."""
    if token_file is None:
        return os.environ.get("WALSVC_TOKEN") or None
    try:
        with open(token_file, encoding="utf-8") as file:
            token = file.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--token-file: cannot read {token_file}: {exc}") from exc
    if not token:
        raise UsageError(f"--token-file: {token_file} holds no token (its first line is empty)")
    return token
