"""The compiled header walk of a vchannel-only filter (``_speedups.match_hashes``, used by
``walsvc.core._codec.decode_chunk``) against the Python walk it replaces: the same messages,
the same stopping point and units spent for every budget, and the same ``CorruptRecord``
(same message) for a run with bytes flipped or its tail cut."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _envelope_strategies import damage
from hypothesis import example, given
from hypothesis import strategies as st

import walsvc.core._compiled
from walsvc import CorruptRecord, Filter, Message, MessageType
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._budget import DECODE_COST
from walsvc.core._codec import decode_chunk
from walsvc.core._encode import encode

# "plumless" and "buckeroo" share a CRC-32: the walk matches both, the name check one.
VCHANNELS = ["", "a", "b", "plumless", "buckeroo", "c"]


@contextmanager
def _python_walk() -> Iterator[None]:
    saved = walsvc.core._compiled.match_hashes
    walsvc.core._compiled.match_hashes = None
    try:
        yield
    finally:
        walsvc.core._compiled.match_hashes = saved


def _chunk(run: bytes | memoryview, selected: Filter, start: int, end: int, units: int) -> Any:
    try:
        return decode_chunk(run, 7, MemoryMessageId, selected, start, end, units)
    except CorruptRecord as exc:
        return f"CorruptRecord: {exc}"


def test_the_compiled_hash_walk_is_built() -> None:
    assert walsvc.core._compiled.match_hashes is not None


@given(
    st.lists(
        st.tuples(st.sampled_from(VCHANNELS), st.binary(max_size=12), st.integers(0, 99)),
        max_size=40,
    ),
    st.frozensets(st.sampled_from(VCHANNELS[1:]), min_size=1, max_size=5),
    st.integers(1, 60 * DECODE_COST),
    st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
    st.integers(0, 2**16),
    st.binary(max_size=9),
)
@example([("a", b"x", 1)] * 3, frozenset({"a"}), 1, [], 0, b"")
def test_the_compiled_walk_decodes_and_refuses_what_the_python_walk_does(
    records: list[tuple[str, bytes, int]],
    wanted: frozenset[str],
    units: int,
    flips: list[tuple[int, int]],
    cut: int,
    before: bytes,
) -> None:
    run = bytearray(before)
    for vchannel, payload, tick in records:
        message = Message(payload=payload, vchannel=vchannel, type=MessageType.INSERT)
        run += encode(message, timetick=tick, term=1)
    selected = Filter(vchannels=wanted)
    assert selected.vchannels_only
    view = memoryview(damage(run, len(before), flips, cut))
    compiled = _chunk(view, selected, len(before), len(view), units)
    with _python_walk():
        python = _chunk(view, selected, len(before), len(view), units)
    assert compiled == python


def test_arguments_outside_the_buffer_are_refused() -> None:
    match_hashes = walsvc.core._compiled.match_hashes
    assert match_hashes is not None
    with pytest.raises(ValueError, match="outside"):
        match_hashes(b"abc", 0, 4, frozenset({1}), 10, 0)
    with pytest.raises(OverflowError):
        match_hashes(b"", 0, 0, frozenset({2**40}), 10, 0)
    assert match_hashes(b"", 0, 0, frozenset(), 10, 0) == ([], 0, 0, 10)
