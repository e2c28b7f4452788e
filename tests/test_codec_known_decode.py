"""The compiled decode of a run read with a filter that admits everything
(``_speedups.decode_known``, used by ``walsvc.core._runs.decode_chunk``; and for each
match of a vchannel filter) against the Python loop it shortens: the same messages,
stopping point and units for every budget, and the same ``CorruptRecord`` (same
message) for a run with bytes flipped or its tail cut. The compiled loop makes only what
the codec's caches know and keyed messages' ext sections; every record it leaves is the
Python loop's, so runs mix all kinds: keyed and plain messages, properties,
transactions, last-confirmed ids of this log and of another, names and types seen before
and new."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from _envelope_strategies import MESSAGE_TYPES, PAYLOADS, TEXT, TXNS, damage, in_python
from hypothesis import example, given
from hypothesis import strategies as st

import walsvc.core._codec
import walsvc.core._compiled
from walsvc import CorruptRecord, Filter, ImmutableMessage, Message, MessageType
from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._budget import DECODE_COST
from walsvc.core._encode import encode
from walsvc.core._message import NO_PROPERTIES
from walsvc.core._runs import decode_chunk

_ALL = Filter()
VCHANNELS = st.one_of(st.sampled_from(["", "a", "b", "plumless", "buckeroo"]), TEXT)
# Producer keys ("~<id>.<n>"), short and long msgpack strs (fixstr, str8, str16).
KEYS = st.one_of(
    st.none(),
    st.just(""),
    TEXT,
    st.from_regex(r"~[A-Za-z0-9_-]{16}\.[0-9a-f]{1,16}", fullmatch=True),
    st.text(min_size=30, max_size=300),
)
# Mostly ids of the log read (memory), a few of another (file): those are corrupt.
LAST_CONFIRMED = st.one_of(
    st.none(),
    st.builds(MemoryMessageId, st.integers(0, 5)),
    st.builds(MemoryMessageId, st.integers(0, 2**64 - 1)),
    st.builds(FileMessageId, st.integers(0, 5)),
)
RECORDS = st.lists(
    st.tuples(
        VCHANNELS,
        MESSAGE_TYPES,
        st.one_of(st.just(b"p"), st.binary(min_size=150, max_size=400), PAYLOADS),
        st.one_of(st.just({}), st.just({}), st.dictionaries(TEXT, TEXT, max_size=3)),
        KEYS,
        LAST_CONFIRMED,
        st.one_of(st.just(None), TXNS),
        st.integers(0, 2**64 - 1),
    ),
    max_size=30,
)


def _chunk(run: bytes | memoryview, start: int, units: int, selected: Filter = _ALL) -> Any:
    """What a reader stepping through ``run`` with ``units`` a step gets: each step's
    (messages, offset, seq, units spent), until the end or the CorruptRecord (its
    message) that stops it, so that the messages before a damaged record count too."""
    steps: list[Any] = []
    offset, seq = start, 3
    try:
        while offset < len(run):
            step = decode_chunk(run, seq, MemoryMessageId, selected, offset, len(run), units)
            steps.append(step)
            offset, seq = step[1], step[2]
    except CorruptRecord as exc:
        steps.append(f"CorruptRecord: {exc}")
    return steps


def _python_decode(function: Any, *args: Any) -> Any:
    """``function(*args)`` with the compiled decode switched off, the compiled header walk
    kept: a vchannel-filtered read then charges its steps alike, and stops where the one
    that decodes compiled does."""
    compiled = walsvc.core._compiled
    saved, compiled.decode_known = compiled.decode_known, None
    try:
        return function(*args)
    finally:
        compiled.decode_known = saved


def _run(records: list[Any], before: bytes) -> bytearray:
    run = bytearray(before)
    for vchannel, type_, payload, properties, key, last_confirmed, txn, tick in records:
        message = Message(
            payload=payload,
            vchannel=vchannel,
            type=type_,
            properties=properties,
            idempotency_key=key,
        )
        run += encode(message, timetick=tick, term=7, last_confirmed=last_confirmed, txn=txn)
    return run


def test_the_compiled_decode_is_built() -> None:
    assert walsvc.core._compiled.decode_known is not None


@given(
    RECORDS,
    st.integers(1, 40 * DECODE_COST),
    st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
    st.one_of(st.just(0), st.integers(0, 2**16)),
    st.binary(max_size=9),
)
@example(
    [("a", MessageType.INSERT, b"x", {}, "k", MemoryMessageId(1), None, 5)] * 3, 99, [], 0, b""
)
@example([("a", MessageType.INSERT, b"x", {}, "k", FileMessageId(1), None, 5)] * 2, 99, [], 0, b"")
@example(  # keys as a msgpack str8 (made) and a str16 (left to Python)
    [
        ("a", MessageType.INSERT, b"x", {}, key, MemoryMessageId(1), None, 5)
        for key in ("k" * 100, "k" * 300, "k" * 100)
    ],
    99,
    [],
    0,
    b"",
)
def test_the_compiled_decode_makes_and_refuses_what_the_python_loop_does(
    records: list[Any], units: int, flips: list[tuple[int, int]], cut: int, before: bytes
) -> None:
    run = _run(records, before)
    view = memoryview(damage(run, len(before), flips, cut))
    python = in_python(_chunk, view, len(before), units)  # first: it fills the caches
    assert _chunk(view, len(before), units) == python
    assert _chunk(bytes(view), len(before), units) == python


@given(
    RECORDS,
    st.frozensets(st.sampled_from(["", "a", "b", "plumless"]), min_size=1),
    st.integers(1, 40 * DECODE_COST),
    st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
    st.one_of(st.just(0), st.integers(0, 2**16)),
)
@example(
    [(v, MessageType.INSERT, b"x", {}, "k", MemoryMessageId(1), None, 5) for v in "abab"],
    frozenset("a"),
    99,
    [],
    0,
)
def test_the_compiled_decode_of_a_vchannel_filtered_read_is_the_python_loops(
    records: list[Any],
    vchannels: frozenset[str],
    units: int,
    flips: list[tuple[int, int]],
    cut: int,
) -> None:
    """The matches ``match_hashes`` finds are made by ``decode_known`` where it can."""
    view = memoryview(damage(_run(records, b""), 0, flips, cut))
    selected = Filter(vchannels=vchannels)
    python = _python_decode(_chunk, view, 0, units, selected)
    assert _chunk(view, 0, units, selected) == python
    assert _chunk(bytes(view), 0, units, selected) == python


@pytest.mark.parametrize("properties", [False, True])
def test_the_matches_of_a_vchannel_filter_are_made_by_the_compiled_loop(
    monkeypatch: pytest.MonkeyPatch, properties: bool
) -> None:
    """Every match of a vchannel filter is made by ``decode_known`` but the first, whose
    name is new to the caches (the property above would hold if it declined them all).
    Matches it never makes (with properties) are tried twice, then once in ``_ALONE``."""
    decode_known = walsvc.core._compiled.decode_known
    assert decode_known is not None
    fresh = f"fresh-{uuid.uuid4().hex}"  # the caches are the process's: a name never seen
    records = [
        (fresh if i % 4 == 1 else f"v{i % 4}", MessageType.INSERT, b"x" * i,
         {"p": "q"} if properties else {}, f"~p.{i:x}",
         MemoryMessageId(7), None, 100 + i)
        for i in range(100)
    ]  # fmt: skip
    run = bytes(_run(records, b""))
    selected = Filter(vchannels=[fresh])
    made: list[ImmutableMessage] = []
    calls = 0

    def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        result = decode_known(*args)
        made.extend(result[0])
        return result

    monkeypatch.setattr(walsvc.core._compiled, "decode_known", counted)
    (compiled,) = _chunk(run, 0, 999 * DECODE_COST, selected)
    monkeypatch.undo()
    (python,) = _python_decode(_chunk, run, 0, 999 * DECODE_COST, selected)
    assert compiled == python
    assert len(python[0]) == 25
    if properties:
        assert made == []
        assert calls == 3  # the first two matches, then the 18th (after _ALONE = 16)
    else:
        assert made == python[0][1:]
        assert calls == 25


def test_a_run_of_known_plain_and_keyed_records_is_made_whole_by_the_compiled_loop() -> None:
    """Once the Python loop has seen a run's names, types and last-confirmed ids, the
    compiled loop makes every message of it (the property above would hold if it
    declined everything)."""
    decode_known = walsvc.core._compiled.decode_known
    assert decode_known is not None
    records = [
        (f"v{i % 3}", MessageType.INSERT, b"x" * i, {}, f"~p.{i:x}" if i % 2 else None,
         MemoryMessageId(i // 4), None, 100 + i)
        for i in range(12)
    ]  # fmt: skip
    run = bytes(_run(records, b""))
    (python,) = in_python(_chunk, run, 0, 99 * DECODE_COST)
    messages, offset, seq = decode_known(run, 0, len(run), 3, 99, MemoryMessageId, *_caches())
    assert (messages, offset, seq) == (python[0], len(run), 15)
    assert [m.idempotency_key for m in messages[:2]] == [None, "~p.1"]


def _caches() -> list[Any]:
    codec = walsvc.core._codec
    return [
        ImmutableMessage,
        codec._vchannel_str,
        codec._types,
        codec._ext_cache,
        codec._last_confirmed_ids,
        NO_PROPERTIES,
    ]


def test_arguments_outside_the_buffer_or_of_the_wrong_kind_are_refused() -> None:
    decode_known = walsvc.core._compiled.decode_known
    assert decode_known is not None
    with pytest.raises(ValueError, match="outside"):
        decode_known(b"abc", 0, 4, 0, 9, MemoryMessageId, *_caches())
    with pytest.raises(TypeError, match="dicts"):
        decode_known(b"", 0, 0, 0, 9, MemoryMessageId, ImmutableMessage, [], {}, {}, {}, None)
    with pytest.raises(TypeError, match="12 arguments"):
        decode_known(b"", 0, 0)
    assert decode_known(b"", 0, 0, 0, 9, MemoryMessageId, *_caches()) == ([], 0, 0)


def _messages(steps: list[Any]) -> tuple[list[ImmutableMessage], str | None]:
    """The messages of ``_chunk``'s steps, and the CorruptRecord that stopped them."""
    messages = [m for step in steps if not isinstance(step, str) for m in step[0]]
    errors = [step for step in steps if isinstance(step, str)]
    return messages, errors[0] if errors else None


@given(
    RECORDS,
    st.integers(0, 2**64 - 1),
    st.integers(1, 40 * DECODE_COST),
    st.booleans(),
)
@example([("a", MessageType.INSERT, b"x", {}, "k", None, None, t) for t in range(9)], 4, 99, True)
def test_a_read_from_a_tick_delivers_what_the_general_filter_loop_does(
    records: list[Any], floor: int, units: int, in_order: bool
) -> None:
    """A filter on ``min_timetick`` alone steps over the records below it by their
    headers, then decodes the rest as a read of everything does (compiled): the messages
    the filter admits, the same as the loop for filters of every shape delivers (that
    filter, kept from the short way). Records below
    the floor after the first above it (a log out of tick order) are decoded too: one
    the general loop would step over can raise instead (what came before agrees, up to
    the step that raised: a step that raises delivers nothing)."""
    if in_order:
        records = sorted(records, key=lambda record: record[-1])
    run = bytes(_run(records, b""))
    selected = Filter(min_timetick=floor)
    floor_only = _messages(_chunk(run, 0, units, selected))
    short_way = Filter.is_floor_only
    Filter.is_floor_only = property(lambda _: False)  # type: ignore[assignment, method-assign]
    try:
        general = _messages(_chunk(run, 0, units, selected))
    finally:
        Filter.is_floor_only = short_way  # type: ignore[method-assign]
    if floor_only[1] is None and general[1] is None:
        assert floor_only == general
    else:  # a step that raises delivers nothing: the two step differently
        assert floor_only[1] is not None
        shorter, longer = sorted((floor_only[0], general[0]), key=len)
        assert longer[: len(shorter)] == shorter
