"""Runs of envelopes read as columns (``walsvc.core._columns``, the Spark reader's):
``decode_columns`` reads what ``decode_run`` reads, field by field, and the compiled loops
(``walsvc/core/_speedups.c``) are built and read, gather and refuse exactly what their
Python twins do: the header walk, the payload gather and the message-id column."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from _envelope_strategies import envelopes, in_python
from hypothesis import assume, example, given
from hypothesis import strategies as st

import walsvc.core._columns
import walsvc.core._compiled
from walsvc import CorruptRecord, Filter, Message, MessageType, TxnContext
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._codec import ext_fields
from walsvc.core._columns import HeaderColumns, decode_columns, gather_payloads, walk_columns
from walsvc.core._encode import encode
from walsvc.core._runs import decode_run


def test_decode_columns_agrees_with_decode_run_field_by_field() -> None:
    """The column-wise header decoder (the Spark reader's) reads what ``decode_run``
    reads: types, vchannels (several, one per record in turn), ticks, terms, ext
    sections (properties, txn) and payload bounds; garbage raises ``CorruptRecord``."""
    messages = [
        Message(payload=b"p%d" % i, vchannel=["a", "bb", "", "ä"][i % 4], type=MessageType.INSERT)
        for i in range(8)
    ] + [
        Message(payload=b"", vchannel="a", properties={"k": "v"}),
        Message(payload=b"x" * 300, vchannel="bb", type=MessageType.DELETE),
    ]
    last = MemoryMessageId(3)
    records = [
        encode(m, timetick=100 + i, term=7, last_confirmed=last if i % 2 else None)
        for i, m in enumerate(messages)
    ]
    records.append(
        encode(messages[0], timetick=200, term=7, txn=TxnContext(txn_id=5, keepalive_ms=10))
    )
    run = b"".join(records)
    expected = decode_run(run, 0, MemoryMessageId, Filter.everything())
    columns = decode_columns(memoryview(run))
    assert columns.types == [int(m.type) for m in expected]
    assert columns.vchannels == [m.vchannel for m in expected]
    assert columns.timeticks == [m.timetick for m in expected]
    assert columns.terms == [m.term for m in expected]
    view = memoryview(run)
    payloads = [bytes(view[s:e]) for s, e in zip(columns.payload_starts, columns.ends, strict=True)]
    assert payloads == [m.payload for m in expected]
    fields = [ext_fields(ext, MemoryMessageId) for ext in columns.exts]
    assert [dict(p) for p, _ in fields] == [dict(m.properties) for m in expected]
    assert [t for _, t in fields] == [m.txn for m in expected]
    for bad in (run[:-1], run[:10], b"\x09" + run[1:]):
        with pytest.raises(CorruptRecord):
            decode_columns(bad)


def test_the_compiled_header_walk_is_built() -> None:
    """``make test`` builds walsvc/core/_speedups.c (a C compiler is part of the test
    environment); without it the Spark reader silently runs ten times slower."""
    assert all(walsvc.core._compiled.available().values()), walsvc.core._compiled.available()


def _walk(walker: str, run: bytes | memoryview) -> HeaderColumns | str:
    """The columns one walker reads from ``run``, or the CorruptRecord it raises (each
    walker starts with no vchannel names checked)."""
    walsvc.core._columns._column_names.clear()
    try:
        if walker == "compiled":
            return decode_columns(run)
        columns = HeaderColumns()
        walk_columns(run, 0, len(run), columns)
        return columns
    except CorruptRecord as exc:
        return f"CorruptRecord: {exc}"


@given(
    st.lists(envelopes(), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=3),
    st.integers(0, 2**16),
)
@example([(Message(payload=b"", vchannel="v"), {"timetick": 1, "term": 1}, b"")], [], 0)
def test_the_compiled_walk_reads_and_refuses_exactly_what_the_python_walk_does(
    runs: list[tuple[Message, dict[str, Any], bytes]],
    flips: list[tuple[int, int]],
    cut: int,
) -> None:
    """Same columns for a valid run; the same CorruptRecord (same message) for a run with
    bytes flipped or its tail cut."""
    run = bytearray(b"".join(encoded for _, _, encoded in runs))
    for position, value in flips:
        run[position % len(run)] = value
    if cut:
        del run[len(run) - cut % len(run) :]
    compiled, python = _walk("compiled", memoryview(run)), _walk("python", memoryview(run))
    if isinstance(python, str) or isinstance(compiled, str):
        assert compiled == python
    else:
        for field in HeaderColumns.__slots__:
            assert getattr(compiled, field) == getattr(python, field), field


@given(st.lists(envelopes(), max_size=6))
def test_the_compiled_payload_gather_matches_the_python_one(
    runs: list[tuple[Message, dict[str, Any], bytes]],
) -> None:
    run = memoryview(b"".join(encoded for _, _, encoded in runs))
    columns = decode_columns(run)
    compiled = gather_payloads(run, columns.payload_starts, columns.ends)
    python = in_python(gather_payloads, run, columns.payload_starts, columns.ends)
    assert compiled == python
    assert python[1] == b"".join(m.payload for m, _, _ in runs)


@given(st.text(max_size=8), st.integers(0, 2**63 - 1 - 50), st.integers(0, 50))
@example("file:", 0, 11)
@example("", 2**63 - 1 - 50, 50)
def test_the_compiled_id_column_holds_prefix_and_number(
    prefix: str, first: int, count: int
) -> None:
    """``numbered_strings`` (the Spark reader's message-id column) writes what an
    f-string writes, as Arrow offsets and values."""
    assume(all(not 0xD800 <= ord(c) <= 0xDFFF for c in prefix))
    assert walsvc.core._compiled.numbered_strings is not None
    offsets, values = walsvc.core._compiled.numbered_strings(prefix.encode(), first, count)
    ends = struct.unpack(f"={count + 1}i", offsets)
    got = [values[a:b].decode() for a, b in itertools.pairwise(ends)]
    assert got == [f"{prefix}{seq}" for seq in range(first, first + count)]
    assert ends[0] == 0
    assert ends[-1] == len(values)
