"""``open_wal``, the one users call: ``walsvc://`` URLs go to a node, every other scheme
to a WAL in this process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from walsvc.core._chain import ChainMember
from walsvc.core._errors import InvalidArgument
from walsvc.core._timetick import TimetickAllocator
from walsvc.wal._api import WAL
from walsvc.wal._open import open_wal as open_local_wal
from walsvc.wal._wal import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_TAIL_CACHE_AGE,
    DEFAULT_TAIL_CACHE_BYTES,
)

from ._client import open_remote_wal

__all__ = ("open_wal",)


async def open_wal(
    url: str,
    pchannel: str,
    *,
    read_only: bool = False,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    timetick_allocator: TimetickAllocator | None = None,
    interceptors: Sequence[ChainMember] | Callable[[], Sequence[ChainMember]] | None = None,
    tail_cache_bytes: int = DEFAULT_TAIL_CACHE_BYTES,
    tail_cache_age: float = DEFAULT_TAIL_CACHE_AGE,
    **options: Any,
) -> WAL:
    """Open one pchannel of the log at ``url`` and return the WAL (an async context
    manager).

    ``url`` picks the backend by scheme: ``memory://NAME``, ``file:///abs/path`` or
    ``file://relative/path``, ``kafka://host:port``, ``pulsar://host:port``, or
    ``walsvc://host:port`` for a walsvc node (``walsvc serve``), whose WAL has the same
    methods, semantics and errors. ``pchannel`` is 1-200 characters of
    ``[A-Za-z0-9._-]``, starting with a letter or digit. Opening read-write fences the
    previous writer of the pchannel and recovers the timetick floor from the log.
    Backend-specific ``options`` are passed to the backend; unknown ones raise
    ``TypeError``.

    ``interceptors`` is the append chain, outermost first; None builds the default
    (``interceptors.default_chain()``: timetick sync every 10 ms, which first appends a
    TimeTick straight to the backend, then dedup, exclusive DDL, transactions, redo;
    without redo on a backend whose appends never fail retriably, ``memory://``).
    It may also be a function returning the chain (what ``open_node`` needs, one chain
    per pchannel). Each interceptor instance serves one WAL: an instance that already
    serves another raises ``InvalidArgument`` here, before anything is opened. Their
    ``ready`` hooks (the opening TimeTick;
    dedup rebuilding its window from the log) run in the background: the first append
    waits for them, reads do not. ``interceptors=[]`` gives a bare WAL: no TimeTicks,
    no dedup, no transactions. A read-only WAL has no chain.

    A writer keeps the newest messages in a tail cache its scanners share, bounded by
    ``tail_cache_bytes`` (0 turns it off) and ``tail_cache_age`` seconds; it holds
    entries only while a scanner is open.

    On a node (``walsvc://``) the node is the writer: it owns the chain, the timetick
    allocator, the message size limit and the tail cache, so those arguments must keep
    their defaults (else ``InvalidArgument``); ``read_only=True`` gives a handle that
    reads and refuses appends, without fencing anything. Its options: ``token`` (the
    node's bearer token), ``tls`` (an ``ssl.SSLContext`` trusting the node's certificate,
    with a client certificate loaded if the node demands one), ``window_messages`` and
    ``window_bytes`` (each scanner's credit: how much the node may send ahead of the
    reader), ``connect_timeout``. A lost connection is redialled for
    ``reconnect_timeout`` seconds (default 30; 0: never): appends in flight are resent
    and land exactly once (``exactly_once=True``, the default, gives each message
    without an idempotency key a producer key), scanners resume right after their last
    message; only when the node stays out of reach that long do appends in flight raise
    ``AppendOutcomeUnknown``. ``heartbeat`` (default 5 s): a silent node is pinged, and
    after twice that its socket is dropped and redialled. Transactions and durable
    subscriptions are the node's: a transaction outlives its client's connection
    (``RemoteWAL.resume_txn`` takes it up), one reader per subscription name across all
    the node's clients.

    Raises ``UnknownBackend`` for an unknown scheme or a missing extra,
    ``InvalidArgument`` for a malformed URL, pchannel or option value, and
    ``BackendUnavailable`` if the backend (or node) cannot be reached.
    """
    if isinstance(url, str) and url.startswith("walsvc://"):
        local_only = {
            "max_message_size": max_message_size != DEFAULT_MAX_MESSAGE_SIZE,
            "timetick_allocator": timetick_allocator is not None,
            "interceptors": interceptors is not None,
            "tail_cache_bytes": tail_cache_bytes != DEFAULT_TAIL_CACHE_BYTES,
            "tail_cache_age": tail_cache_age != DEFAULT_TAIL_CACHE_AGE,
        }
        given = [name for name, changed in local_only.items() if changed]
        if given:
            raise InvalidArgument(
                f"{', '.join(given)}: the node's writer owns these; set them where the"
                " node runs (walsvc serve), not on a walsvc:// client"
            )
        return await open_remote_wal(url, pchannel, read_only=read_only, **options)
    return await open_local_wal(
        url,
        pchannel,
        read_only=read_only,
        max_message_size=max_message_size,
        timetick_allocator=timetick_allocator,
        interceptors=interceptors,
        tail_cache_bytes=tail_cache_bytes,
        tail_cache_age=tail_cache_age,
        **options,
    )
