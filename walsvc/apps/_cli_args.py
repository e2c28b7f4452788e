"""What the ``walsvc`` subcommands share: the usage error, argument types and the event
loop they run on."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import math
import os
import ssl
from collections.abc import Callable

__all__ = (
    "UsageError",
    "add_node_options",
    "bearer_token",
    "event_loop",
    "int_at_least",
    "node_options",
    "seconds",
    "tls_context",
)


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


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that talks to a walsvc node: its token and TLS."""
    parser.add_argument("--token-file", help="the node's token is this file's first line")
    parser.add_argument("--tls-ca", help="speak TLS, trusting the node's certificate to this CA")
    parser.add_argument("--tls-cert", help="speak TLS with this client certificate (PEM)")
    parser.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context ``add_node_options``' flags ask for, or None (no TLS)."""
    if args.tls_ca is None and args.tls_cert is None:
        if args.tls_key is not None:
            raise UsageError("--tls-key needs --tls-cert")
        return None
    try:
        context = ssl.create_default_context(cafile=args.tls_ca)
        if args.tls_cert is not None:
            context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load the TLS certificates: {exc}") from exc
    return context


def node_options(url: str, args: argparse.Namespace) -> dict[str, object]:
    """``open_wal`` options for ``url`` from ``add_node_options``' flags: the token and
    TLS context for a ``walsvc://`` node, nothing for other schemes (whose backends take
    no such options); a flag given for another scheme is a ``UsageError``."""
    if url.startswith("walsvc://"):
        options: dict[str, object] = {}
        token, tls = bearer_token(args.token_file), tls_context(args)
        if token is not None:
            options["token"] = token
        if tls is not None:
            options["tls"] = tls
        return options
    for flag, value in (
        ("--token-file", args.token_file),
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if value is not None:
            raise UsageError(f"{flag} is for walsvc:// nodes, not {url.partition('://')[0]}://")
    return {}
