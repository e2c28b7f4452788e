"""``open_wal``: URL -> backend -> WAL."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from interceptors._default import default_chain
from walsvc.backends._base import Backend
from walsvc.backends._registry import backend_class
from walsvc.core._chain import ChainMember
from walsvc.core._errors import InvalidArgument, UnknownBackend
from walsvc.core._timetick import HybridClock, TimetickAllocator

from ._wal import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_TAIL_CACHE_AGE,
    DEFAULT_TAIL_CACHE_BYTES,
    LocalWAL,
    check_unbound,
)

__all__ = ("open_wal",)

_PCHANNEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


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
) -> LocalWAL:
    """Open one pchannel of the log at ``url`` and return the WAL (an async context
    manager).

    ``url`` picks the backend by scheme: ``memory://NAME``, ``file:///abs/path`` or
    ``file://relative/path``, ``kafka://host:port``, ``pulsar://host:port``. ``pchannel``
    is 1-200 characters of ``[A-Za-z0-9._-]``, starting with a letter or digit. Opening
    read-write fences the previous writer of the pchannel and recovers the timetick floor
    from the log.
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

    Raises ``UnknownBackend`` for an unknown scheme or a missing extra,
    ``InvalidArgument`` for a malformed URL, pchannel or option value, and
    ``BackendUnavailable`` if the backend cannot be reached.
    """
    scheme, sep, location = url.partition("://")
    if not sep or not scheme:
        raise UnknownBackend(f"{url!r} is not a WAL URL (expected scheme://location)")
    if not isinstance(pchannel, str) or not _PCHANNEL.fullmatch(pchannel):
        raise InvalidArgument(
            f"pchannel {pchannel!r} must be 1-200 characters of [A-Za-z0-9._-],"
            " starting with a letter or digit"
        )
    if not isinstance(max_message_size, int) or max_message_size < 64:
        raise InvalidArgument(f"max_message_size must be an int >= 64, not {max_message_size!r}")
    if type(tail_cache_bytes) is not int or tail_cache_bytes < 0:
        raise InvalidArgument(f"tail_cache_bytes must be an int >= 0, not {tail_cache_bytes!r}")
    if (
        isinstance(tail_cache_age, bool)
        or not isinstance(tail_cache_age, int | float)
        or not 0 < tail_cache_age <= 86_400
    ):
        raise InvalidArgument(
            f"tail_cache_age must be in (0, 86400] seconds, not {tail_cache_age!r}"
        )
    if read_only and interceptors:
        raise InvalidArgument("a read-only WAL appends nothing, so it takes no interceptors")
    cls = backend_class(scheme)
    members: Sequence[ChainMember] = ()
    if not read_only:
        if interceptors is None:
            members = default_chain(retry=cls.retriable_appends)
        elif callable(interceptors):
            members = tuple(interceptors())
        else:
            members = tuple(interceptors)
        check_unbound(members)  # before opening fences the pchannel's writer
    backend = await cls.open(
        location, pchannel, read_only=read_only, options=options, max_message_size=max_message_size
    )
    allocator = timetick_allocator if timetick_allocator is not None else HybridClock()
    wal = LocalWAL(
        backend,
        allocator=allocator,
        max_message_size=max_message_size,
        interceptors=members,
        tail_cache_bytes=tail_cache_bytes,
        tail_cache_age=float(tail_cache_age),
    )
    if not read_only:
        try:
            await _recover_timetick(backend, allocator)
            wal._newest_at_open = await backend.latest_message_id()
            wal._start()
        except BaseException:
            await wal.aclose()
            raise
    return wal


async def _recover_timetick(backend: Backend, allocator: TimetickAllocator) -> None:
    """Seed the allocator with the newest tick the pchannel ever had, so ticks keep
    increasing across restarts (truncation included)."""
    allocator.observe(await backend.last_timetick())
