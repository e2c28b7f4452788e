"""The compiled header walk of a vchannel-only filter (``_speedups.match_hashes``, used by
``walsvc.core._runs.decode_chunk``) against the Python walk it replaces: the same messages
read a step at a time with any budget, and the same ``CorruptRecord`` (same message) for
a run with bytes flipped or its tail cut. The compiled walk charges a header
``SKIP_COST``, the Python walk ``HEADER_COST`` (it takes about 60 times longer): a step
of the compiled walk examines more headers for the same budget."""

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
from walsvc.core._budget import DECODE_COST, HEADER_COST, SKIP_COST
from walsvc.core._encode import encode
from walsvc.core._runs import decode_chunk

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


def _read(run: bytes | memoryview, selected: Filter, start: int, units: int) -> Any:
    """A reader stepping through ``run`` with ``units`` a step: the messages of all its
    steps and the CorruptRecord (its message) that stopped it, if one did. Checks that
    each step spent its budget (less than one decode over), unless the run ended."""
    messages: list[Any] = []
    offset, seq = start, 7
    try:
        while offset < len(run):
            got, offset, seq, spent = decode_chunk(
                run, seq, MemoryMessageId, selected, offset, len(run), units
            )
            assert spent < units + DECODE_COST
            assert spent >= units or offset == len(run)
            messages += got
    except CorruptRecord as exc:
        return messages, f"CorruptRecord: {exc}"
    return messages, None


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
    compiled = _read(view, selected, len(before), units)
    with _python_walk():
        python = _read(view, selected, len(before), units)
    assert compiled == python


@pytest.mark.parametrize("compiled", [True, False])
def test_a_step_examines_the_headers_its_walk_can_afford(compiled: bool) -> None:
    """1,000 records, every tenth on the vchannel read: a step of two decodes examines what
    they buy at the walk's own costs (the matches cost a decode each)."""
    run = b"".join(
        encode(Message(payload=b"x", vchannel="a" if i % 10 == 9 else "b"), timetick=i, term=1)
        for i in range(1000)
    )
    selected = Filter(vchannels=["a"])
    units = 2 * DECODE_COST
    header = SKIP_COST if compiled else HEADER_COST
    # the headers of nine misses, then a match, until the units are spent
    cost, examined = 0, 0
    while cost < units:
        cost += DECODE_COST if examined % 10 == 9 else header
        examined += 1
    if compiled:
        got, _, seq, spent = decode_chunk(run, 0, MemoryMessageId, selected, 0, len(run), units)
    else:
        with _python_walk():
            got, _, seq, spent = decode_chunk(run, 0, MemoryMessageId, selected, 0, len(run), units)
    assert (seq, spent, len(got)) == (examined, cost, examined // 10)


def test_arguments_outside_the_buffer_are_refused() -> None:
    match_hashes = walsvc.core._compiled.match_hashes
    assert match_hashes is not None
    with pytest.raises(ValueError, match="outside"):
        match_hashes(b"abc", 0, 4, frozenset({1}), 10, 0)
    with pytest.raises(OverflowError):
        match_hashes(b"", 0, 0, frozenset({2**40}), 10, 0)
    assert match_hashes(b"", 0, 0, frozenset(), 10, 0) == ([], 0, 0, 10)
