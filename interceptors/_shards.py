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

``KeyQueue`` is that order: the window's keys (and runs), first in first out, in a ring
the cycle collector does not track (a deque of a million keys is tracked, and a
collection of its generation reads every key: 23.5 ms for the first young collection
after filling a million-key window on ``file://``). ``Queue`` is what the window uses
of it, the deque operations it answers as a deque does. ``KeyQueue(capacity)`` reserves
room for that many keys. Without the C compiler it is a deque.

Four loops of the window over a whole batch are compiled too, with the same results
without the compiler: ``window_keys`` (the window key of each message of a batch),
``evict_settled`` (eviction of the oldest settled keys), ``counted_run`` (whether a
batch's keys are a run of counted keys, ``_dedup_runs``; ``counted_key`` parses one) and
``spans_hold`` (whether a run may hold one of a batch's keys).
Per message in Python the first two were about a fifth of a remote node's CPU per
``append_many`` of 100 keyed messages, ``counted_run`` about a seventh; ``spans_hold``
in Python cost single keyed appends a fifth to a third of their rate while a run of
their stem was in the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

__all__ = (
    "KeyQueue",
    "Queue",
    "ShardedDict",
    "Table",
    "counted",
    "counted_key",
    "counted_run",
    "evict_settled",
    "spans_hold",
    "window_keys",
)

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


#: Per separator of a counted key: the base of its counter and the bound of its numbers
#: (15 hex digits, 18 decimal ones: below 2**60, so that a C long long holds them).
_COUNTERS: Final = {".": (16, 16**15), "#": (10, 10**18)}
_HEX: Final = frozenset("0123456789abcdef")
_DECIMAL: Final = frozenset("0123456789")


def counted_key(key: str) -> tuple[str, int] | None:
    """The stem and number of a counted key, or None if ``key`` is not one. A counted
    key is a stem ending in ``.`` and a counter in canonical lowercase hex (a
    ``walsvc://`` client's producer keys, ``~<producer>.<n>``), or a stem ending in
    ``#`` and a counter in canonical decimal (``walsvc.producer_key``): no leading zero,
    below 16**15 and 10**18."""
    at = max(key.rfind("."), key.rfind("#"))
    if at < 0:
        return None
    digits = key[at + 1 :]
    base, bound = _COUNTERS[key[at]]
    if (
        not digits
        or (digits[0] == "0" and len(digits) > 1)
        or not (_HEX if base == 16 else _DECIMAL).issuperset(digits)
    ):
        return None
    number = int(digits, base)
    return (key[: at + 1], number) if number < bound else None


def counted(stem: str, number: int) -> str:
    """The counted key numbered ``number`` of ``stem`` (``counted_key``'s inverse)."""
    return f"{stem}{number:x}" if stem[-1] == "." else f"{stem}{number}"


def _counted_run(messages: Sequence[Any]) -> tuple[str, int, tuple[str, ...]] | None:
    """The stem, first number and vchannels of ``messages`` if they are a run: two or
    more messages outside transactions whose keys are one stem counted up by one
    (``counted_key``), on str vchannels; else None."""
    if len(messages) < 2:
        return None
    first_key = messages[0].idempotency_key
    if type(first_key) is not str:
        return None
    parsed = counted_key(first_key)
    if parsed is None:
        return None
    stem, first = parsed
    if first + len(messages) > _COUNTERS[stem[-1]][1]:
        return None
    number = first
    for message in messages:
        key = message.idempotency_key
        if (
            message.txn is not None
            or type(key) is not str
            or key != counted(stem, number)
            or type(message.vchannel) is not str
        ):
            return None
        number += 1
    return stem, first, tuple(message.vchannel for message in messages)


def _spans_hold(keys: Sequence[Any], spans: dict[str, tuple[int, int]]) -> bool:
    """True if one of the window keys ``keys`` is a counted key (``counted_key``) whose
    number is within its stem's span ``[low, end)`` in ``spans``."""
    for key in keys:
        if type(key) is str:
            _vchannel, nul, text = key.partition("\0")
            if not nul:
                continue
        elif type(key) is tuple and len(key) == 2 and type(key[1]) is str:
            text = key[1]
        else:
            continue
        parsed = counted_key(text)
        if parsed is not None:
            span = spans.get(parsed[0])
            if span is not None and span[0] <= parsed[1] < span[1]:
                return True
    return False


ShardedDict = dict
KeyQueue: Callable[[int], Queue[Any]] = _deque_queue
window_keys: Callable[[Sequence[Any]], list[str] | None] = _window_keys
counted_run: Callable[[Sequence[Any]], tuple[str, int, tuple[str, ...]] | None] = _counted_run
spans_hold: Callable[[Sequence[Any], dict[str, tuple[int, int]]], bool] = _spans_hold
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
        counted_run = _cshards.counted_run
        spans_hold = _cshards.spans_hold
