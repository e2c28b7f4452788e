"""``walsvc serve``: run a node that serves the pchannels of one log over the network.

Prints one line, ``walsvc node serving URL at walsvc://HOST:PORT``, once it listens (a
supervisor or test reads the bound port from it; with ``--metrics-port`` a second,
``walsvc node metrics at http://HOST:PORT/metrics``), then serves until SIGTERM or Ctrl-C
(SIGINT). Then it drains (``NodeServer.drain``: ``GoingAway`` to every client, every
request received answered, streams ended, WALs closed) for at most ``--drain-timeout``
seconds and exits 0; a second signal cuts the drain short.
``--sync`` is the file backend's sync mode; ``--dedup-keys``/``--dedup-age`` size each
pchannel's dedup window (``interceptors.Dedup``); the limits of ``walsvc.NodeLimits`` (timeouts,
bytes queued for a peer) have flags of their own; ``--tls-cert``/``--tls-key`` serve over TLS
(``--tls-client-ca`` demands client certificates); the bearer token comes from the first line
of ``--token-file`` or else the environment variable ``WALSVC_TOKEN`` (never the command
line, where ``ps`` would show it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import ssl
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from interceptors import DEFAULT_MAX_AGE, DEFAULT_MAX_KEYS, Dedup, default_chain
from walsvc.backends._registry import backend_class
from walsvc.core._chain import ChainMember
from walsvc.core._errors import WALError
from walsvc.remote._node_status import NodeLimits
from walsvc.service._server import serve

from ._cli_args import UsageError, bearer_token, event_loop, int_at_least, seconds

__all__ = ("add_serve_parser", "run_serve_command")


def add_serve_parser(commands: Any) -> None:
    """Add ``walsvc serve`` to the command line's subparsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="serve the pchannels of a log to walsvc:// clients",
        description=(
            "Serve the pchannels of the log at --url to walsvc:// clients on --listen."
            " The node is each pchannel's single writer. Clients must present the token"
            " of --token-file, or else of WALSVC_TOKEN, when one is set."
        ),
    )
    parser.add_argument("--url", required=True, help="the log, e.g. file:///data/wal")
    parser.add_argument(
        "--listen", default="127.0.0.1:7070", help="host:port (port 0: any free port)"
    )
    parser.add_argument(
        "--token-file",
        help="clients must present the token on this file's first line (default: WALSVC_TOKEN)",
    )
    parser.add_argument("--tls-cert", help="serve over TLS: the node's certificate chain (PEM)")
    parser.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    parser.add_argument(
        "--tls-client-ca",
        help="demand client certificates signed by this CA (PEM); needs --tls-cert",
    )
    parser.add_argument(
        "--sync",
        choices=("always", "none"),
        default=None,
        help="file:// backends: when appends reach the disk",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds,
        default=30.0,
        metavar="S",
        help="on SIGTERM or SIGINT, finish what clients asked within this time (%(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int_at_least(0),
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (the metrics extra;"
        " HOST: --metrics-host); port 0: any free port, printed",
    )
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="where --metrics-port listens (%(default)s)"
    )
    window = parser.add_argument_group(
        "the dedup window of each pchannel (idempotency keys, and the producer keys with"
        " which reconnecting clients resend)"
    )
    window.add_argument(
        "--dedup-keys",
        type=int_at_least(1),
        default=DEFAULT_MAX_KEYS,
        metavar="N",
        help="keys remembered per pchannel (%(default)s)",
    )
    window.add_argument(
        "--dedup-age",
        type=seconds,
        default=DEFAULT_MAX_AGE,
        metavar="S",
        help="seconds a key is remembered, by timetick; also how much log a node reads"
        " back to rebuild the window when it opens a pchannel (%(default)s)",
    )
    limits = parser.add_argument_group("limits on each peer (a peer over one is cut off)")
    default = NodeLimits()
    limits.add_argument(
        "--send-queue-limit",
        type=int_at_least(1),
        default=default.send_queue_bytes,
        metavar="BYTES",
        help="above this many bytes queued for a peer, read no more of its requests (%(default)s)",
    )
    limits.add_argument(
        "--max-in-flight",
        type=int_at_least(1),
        default=default.max_in_flight,
        metavar="N",
        help="above this many requests of a peer unanswered, read no more (%(default)s)",
    )
    limits.add_argument(
        "--max-in-flight-bytes",
        type=int_at_least(1),
        default=default.max_in_flight_bytes,
        metavar="BYTES",
        help="the same for the bytes of messages they hold (%(default)s)",
    )
    limits.add_argument(
        "--stall-timeout",
        type=seconds,
        default=default.stall_timeout,
        metavar="S",
        help="cut off a peer that stays above --send-queue-limit this long (%(default)s)",
    )
    limits.add_argument(
        "--frame-timeout",
        type=seconds,
        default=default.frame_timeout,
        metavar="S",
        help="cut off a peer whose begun frame stays incomplete this long (%(default)s)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=seconds,
        default=default.idle_timeout,
        metavar="S",
        help="cut off a peer that sends nothing this long (default: never)",
    )
    limits.add_argument(
        "--handshake-timeout",
        type=seconds,
        default=default.handshake_timeout,
        metavar="S",
        help="cut off a peer that has not completed its handshake by then (%(default)s)",
    )


def _chain(url: str, max_keys: int, max_age: float) -> Callable[[], list[ChainMember]]:
    """What builds each pchannel's chain: the default one, with a dedup window of
    ``max_keys`` and ``max_age``."""
    try:
        retry = backend_class(url.partition("://")[0]).retriable_appends
    except WALError as exc:  # an unknown scheme: the node's own opening says so
        raise UsageError(str(exc)) from exc
    return lambda: default_chain(dedup=Dedup(max_keys=max_keys, max_age=max_age), retry=retry)


async def _serve(args: argparse.Namespace) -> None:
    options: dict[str, Any] = {}
    if args.sync is not None:
        options["sync"] = args.sync
    if (args.dedup_keys, args.dedup_age) != (DEFAULT_MAX_KEYS, DEFAULT_MAX_AGE):
        options["interceptors"] = _chain(args.url, args.dedup_keys, args.dedup_age)
    token = bearer_token(args.token_file)
    limits = NodeLimits(
        handshake_timeout=args.handshake_timeout,
        frame_timeout=args.frame_timeout,
        idle_timeout=args.idle_timeout,
        send_queue_bytes=args.send_queue_limit,
        stall_timeout=args.stall_timeout,
        max_in_flight=args.max_in_flight,
        max_in_flight_bytes=args.max_in_flight_bytes,
    )
    tls = _tls(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    metrics = _metrics_module() if args.metrics_port is not None else None
    if metrics is not None:
        metrics.enable()  # before the node opens its first WAL
    async with contextlib.AsyncExitStack() as stack:
        node = await stack.enter_async_context(
            serve(args.url, args.listen, token=token, tls=tls, limits=limits, **options)
        )
        if metrics is not None:
            metrics.watch_node(node)
            exporter = await metrics.serve_metrics(
                metrics.REGISTRY, args.metrics_host, args.metrics_port
            )
            stack.push_async_callback(exporter.wait_closed)
            stack.callback(exporter.close)
        print(f"walsvc node serving {args.url} at {node.node_url}", flush=True)
        if metrics is not None:
            host, port = exporter.sockets[0].getsockname()[:2]
            print(f"walsvc node metrics at http://{host}:{port}/metrics", flush=True)
        await stop.wait()
        stop.clear()
        print(f"walsvc node draining (at most {args.drain_timeout:g} s)", flush=True)
        draining = asyncio.create_task(node.drain(args.drain_timeout))
        again = asyncio.create_task(stop.wait())  # a second signal: stop at once
        await asyncio.wait((draining, again), return_when=asyncio.FIRST_COMPLETED)
        again.cancel()
        draining.cancel()  # if it is still running
        await asyncio.gather(again, return_exceptions=True)
        with contextlib.suppress(asyncio.CancelledError):
            await draining
    print("walsvc node stopped", flush=True)


def _metrics_module() -> ModuleType:
    """``walsvc.metrics``, or a ``UsageError`` naming the extra it needs."""
    try:
        import walsvc.metrics as metrics
    except ImportError as exc:
        raise UsageError(
            f"--metrics-port needs the metrics extra: pip install 'walsvc[metrics]' ({exc})"
        ) from exc
    return metrics


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The server's TLS context from ``--tls-cert``/``--tls-key``/``--tls-client-ca``."""
    if args.tls_cert is None:
        if args.tls_key is not None or args.tls_client_ca is not None:
            raise UsageError("--tls-key and --tls-client-ca need --tls-cert")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(args.tls_client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load the TLS certificate or key: {exc}") from exc
    return context


def run_serve_command(args: argparse.Namespace) -> int:
    """Run ``walsvc serve``; return the exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    loop_factory, _ = event_loop()
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_serve(args))
    except (WALError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
