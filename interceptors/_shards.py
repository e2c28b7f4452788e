"""The dedup window's table: ``ShardedDict``, a dict split in shards by key hash.

A CPython dict under churn (a key claimed and the oldest evicted per append) never reuses
a deleted key's entry, so it rebuilds itself every n to 2n inserts in one step that
holds the event loop: 5.9 ms at the dedup window's default 100k keys, 53 ms at a million
(measured: ``Dedup`` on ``memory://``, keyed ``append_many`` of 100, a 1 ms monitor
timer). ``ShardedDict`` (``_cshards.c``) spreads the keys over 64 dicts, so that a
rebuild is of one of them. Where walsvc was built without a C compiler the table is one
dict.

``Table`` is what the window uses of it: the dict operations ``ShardedDict`` answers as a
dict does (no iteration, no order: the window keeps its own).

``KeyQueue`` is that order: the window's keys, first in first out, in a ring the cycle
collector does not track (a deque of a million keys is tracked, and a collection of its
generation reads every key: 23.5 ms for the first young collection after filling a
million-key window on ``file://``). ``Queue`` is what the window uses of it, the deque
operations it answers as a deque does. ``KeyQueue(capacity)`` reserves room for that
many keys. Without the C compiler it is a deque.

Two loops of the window over a whole batch are compiled too, with the same results
without the compiler: ``window_keys`` (the window key of each message of a batch) and
``evict_settled`` (eviction of the oldest settled keys). Per message in Python they
were about a fifth of a remote node's CPU per ``append_many`` of 100 keyed messages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

__all__ = ("KeyQueue", "Queue", "ShardedDict", "Table", "evict_settled", "window_keys")

_K = TypeVar("_K", contravariant=True)
_V = TypeVar("_V")


class Table(Protocol[_K, _V]):
    """The mapping operations of the window's table."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: _K, /) -> _V: ...
    def __setitem__(self, key: _K, value: _V, /) -> None: ...
    def __delitem__(self, key: _K, /) -> None: ...
    def __contains__(self, key: object, /) -> bool: ...
    def get(self, key: _K, /) -> _V | None: ...
    def setdefault(self, key: _K, default: _V, /) -> _V: ...
    def pop(self, key: _K, /) -> _V: ...
    def update(self, pairs: Iterable[tuple[_K, _V]], /) -> None: ...


class Queue(Protocol[_V]):
    """The deque operations of the window's order of keys."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> _V: ...
    def __iter__(self) -> Iterator[_V]: ...
    def append(self, key: _V, /) -> None: ...
    def extend(self, keys: Iterable[_V], /) -> None: ...
    def popleft(self) -> _V: ...


def _deque_queue(capacity: int = 0) -> Queue[Any]:
    """The queue without the C compiler: a deque (``capacity`` is a hint it needs not)."""
    return deque()


def _window_keys(messages: Sequence[Any]) -> list[str] | None:
    """The window key of each message (``vchannel + "\0" + idempotency_key``), or None if
    one takes the slow path: no key, a key or vchannel not a str, a NUL in the vchannel."""
    keys = []
    for message in messages:
        vchannel, key = message.vchannel, message.idempotency_key
        if type(key) is not str or type(vchannel) is not str or "\0" in vchannel:
            return None
        keys.append(f"{vchannel}\0{key}")
    return keys


def _evict_settled(
    order: Queue[Any], slots: Table[Any, Any], max_keys: int, horizon: int, settled: type
) -> int:
    """Drop the oldest keys whose slot is a ``settled`` (an ``AppendResult``: not in
    flight) while the table holds more than ``max_keys`` or their timetick is below
    ``horizon``; stop at the first other slot. Return the newest timetick dropped, or
    -1 if none was."""
    newest = -1
    while order:
        key = order[0]
        slot = slots.get(key)
        if type(slot) is not settled:
            break
        tick: int = getattr(slot, "timetick")  # noqa: B009  # settled: AppendResult
        if len(slots) <= max_keys and tick >= horizon:
            break
        del slots[key]
        order.popleft()
        newest = max(newest, tick)
    return newest


ShardedDict = dict
KeyQueue: Callable[[int], Queue[Any]] = _deque_queue
window_keys: Callable[[Sequence[Any]], list[str] | None] = _window_keys
evict_settled: Callable[[Queue[Any], Table[Any, Any], int, int, type], int] = _evict_settled
if not TYPE_CHECKING:  # the type checker reads dict: what the compiled one answers as
    try:
        from . import _cshards
    except ImportError:  # built without a C compiler: one dict, whose rebuilds hold the loop
        pass
    else:
        ShardedDict = _cshards.ShardedDict
        KeyQueue = _cshards.KeyQueue
        window_keys = _cshards.window_keys
        evict_settled = _cshards.evict_settled
