"""Property tests of the envelope codec: round trips, zero-copy peeks, hostile bytes, and
``decode_run`` against a reference model of filtering."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from _envelope_strategies import IDS, MESSAGE_TYPES, PAYLOADS, TEXT, TXNS, U64, in_python
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import walsvc
import walsvc.core._columns
import walsvc.core._compiled
from walsvc import CorruptRecord, Filter, ImmutableMessage, Message, MessageType, TxnContext
from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._codec import (
    HEADER_SIZE,
    VERSION,
    decode,
    decode_split,
    ext_fields,
    peek,
)
from walsvc.core._columns import HeaderColumns, decode_columns, gather_payloads, walk_columns
from walsvc.core._encode import (
    encode,
)
from walsvc.core._runs import count_run, decode_run

messages = st.builds(
    Message,
    payload=PAYLOADS,
    vchannel=TEXT,
    type=MESSAGE_TYPES,
    properties=st.dictionaries(TEXT, TEXT, max_size=6),
    idempotency_key=st.none() | TEXT,
)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[Message, dict[str, Any], bytes]:
    message = draw(messages)
    system = {
        "timetick": draw(U64),
        "term": draw(U64),
        "last_confirmed": draw(st.none() | IDS),
        "txn": draw(TXNS),
    }
    return message, system, encode(message, **system)


def fields(message: ImmutableMessage) -> dict[str, object]:
    return {
        "message_id": message.message_id,
        "timetick": message.timetick,
        "vchannel": message.vchannel,
        "type": message.type,
        "payload": message.payload,
        "properties": dict(message.properties),
        "last_confirmed_id": message.last_confirmed_id,
        "txn": message.txn,
        "idempotency_key": message.idempotency_key,
        "term": message.term,
    }


# ---------------------------------------------------------------------------------------
# Round trips


@given(envelopes(), IDS)
@example(
    (Message(payload=b"", vchannel=""), {"timetick": 0, "term": 0}, b""),
    MemoryMessageId(0),
)
@example(
    (
        Message(
            payload=b"\x00" * (1 << 20),
            vchannel="\u00fc\U0001f600",
            type=MessageType(65_535),
            properties={"": "", "k\u00e9": "v" * 1000},
            idempotency_key="",
        ),
        {
            "timetick": 2**64 - 1,
            "term": 2**64 - 1,
            "last_confirmed": MemoryMessageId(2**64 - 1),
            "txn": TxnContext(2**64 - 1, 0),
        },
        b"",
    ),
    MemoryMessageId(2**64 - 1),
)
def test_encode_decode_round_trip(
    envelope: tuple[Message, dict[str, Any], bytes], message_id: MemoryMessageId
) -> None:
    message, system, data = envelope
    data = data or encode(message, **system)
    got = decode(data, message_id)
    assert fields(got) == {
        "message_id": message_id,
        "timetick": system["timetick"],
        "vchannel": message.vchannel,
        "type": message.type,
        "payload": message.payload,
        "properties": dict(message.properties),
        "last_confirmed_id": system.get("last_confirmed"),
        "txn": system.get("txn"),
        "idempotency_key": message.idempotency_key,
        "term": system["term"],
    }
    assert type(got.type) is MessageType
    assert type(got.payload) is bytes
    # The same through decode_run, alone and among others.
    assert decode_run(data, message_id.seq, MemoryMessageId, Filter.everything()) == [got]
    assert count_run(data) == 1
    # And split in two at the payload, as the brokers carry it; the payload is kept.
    cut = len(data) - len(message.payload)
    payload = data[cut:]
    split = decode_split(data[:cut], payload, message_id)
    assert split == got
    assert split.payload is payload


@given(envelopes(), st.data())
def test_a_split_envelope_cut_anywhere_else_is_corrupt(
    envelope: tuple[Message, dict[str, Any], bytes], data: st.DataObject
) -> None:
    message, system, _ = envelope
    whole = encode(message, **system)
    right = len(whole) - len(message.payload)
    cut = data.draw(st.integers(0, len(whole)).filter(lambda c: c != right), label="cut")
    with pytest.raises(CorruptRecord):
        decode_split(whole[:cut], whole[cut:], MemoryMessageId(0))
    with pytest.raises(CorruptRecord):  # a payload that is one byte short or long
        decode_split(whole[:right], whole[right:] + b"x", MemoryMessageId(0))


@given(envelopes())
def test_peek_reads_the_header_without_copying_the_payload(
    envelope: tuple[Message, dict[str, Any], bytes],
) -> None:
    message, system, data = envelope
    header = peek(data)
    assert (header.type, header.vchannel, header.timetick, header.term) == (
        message.type,
        message.vchannel,
        system["timetick"],
        system["term"],
    )
    assert header.payload == message.payload
    assert header.payload.obj is data  # a view into the caller's buffer, not a copy
    assert peek(memoryview(data)).payload.obj is data
    # Writes to a mutable buffer show through the view: it aliases, it does not copy.
    buffer = bytearray(data)
    view = peek(memoryview(buffer)).payload
    if message.payload:
        buffer[-1] ^= 0xFF
        assert view[-1] == buffer[-1]
        view.release()


def test_peek_of_a_large_record_does_not_copy() -> None:
    data = encode(Message(payload=b"x" * (8 << 20), vchannel="v"), timetick=1, term=1)
    payload = peek(data).payload
    assert payload.obj is data
    assert payload.nbytes == 8 << 20


def test_layout_keeps_the_fields_a_scan_reads_in_place() -> None:
    """Bytes 0-11 (version, type, length, vchannel hash) are fixed for every version."""
    data = encode(
        Message(payload=b"abc", vchannel="v1", type=MessageType.DELETE),
        timetick=7,
        term=3,
    )
    version, flags, type_no, total = struct.unpack_from("<BBHI", data)
    assert (version, flags, type_no, total) == (VERSION, 0, MessageType.DELETE, len(data))
    assert data.endswith(b"abc")
    assert len(data) >= HEADER_SIZE


# ---------------------------------------------------------------------------------------
# Hostile bytes: the envelope has no checksum (the file backend's frames do), so a
# damaged envelope must give CorruptRecord or a message that differs only in what the
# damaged bytes encode; never another exception, never a hang.

# Which fields a byte of the fixed header feeds. A length may shift every variable part.
_VARIABLE = {"vchannel", "properties", "last_confirmed_id", "txn", "idempotency_key", "payload"}
_HEADER_FIELDS: dict[int, set[str]] = {
    **{i: {"type"} for i in range(2, 4)},
    **{i: set() for i in range(8, 12)},  # vchannel hash: feeds no field (see below)
    **{i: _VARIABLE for i in range(12, 14)},  # vchannel length
    **{i: {"timetick"} for i in range(16, 24)},
    **{i: {"term"} for i in range(24, 32)},
    **{i: _VARIABLE for i in range(32, 36)},  # ext length
}
# Version, flags, total length, reserved: damage there is always detected.
_MUST_REJECT = {0, 1, 4, 5, 6, 7, 14, 15}


def _fields_fed_by(data: bytes, position: int) -> set[str]:
    if position < HEADER_SIZE:
        return _HEADER_FIELDS.get(position, set())
    vc_len, ext_len = struct.unpack_from("<H", data, 12)[0], struct.unpack_from("<I", data, 32)[0]
    if position < HEADER_SIZE + vc_len:
        return {"vchannel"}
    if position < HEADER_SIZE + vc_len + ext_len:
        return {"properties", "last_confirmed_id", "txn", "idempotency_key"}
    return {"payload"}


def _outcome(call: Any, *args: Any, **kwargs: Any) -> Any:
    """The call's result, or None if it raised CorruptRecord (anything else propagates)."""
    try:
        return call(*args, **kwargs)
    except CorruptRecord as exc:
        message = str(exc)
    assert message, "CorruptRecord without a message"
    return None


@given(envelopes(), st.data())
def test_any_truncation_is_corrupt(
    envelope: tuple[Message, dict[str, Any], bytes], data: st.DataObject
) -> None:
    _, _, encoded = envelope
    cut = data.draw(st.integers(0, len(encoded) - 1), label="cut")
    short = encoded[:cut]
    with pytest.raises(CorruptRecord):
        decode(short, MemoryMessageId(0))
    with pytest.raises(CorruptRecord):
        peek(short)
    if cut:  # a run of whole records followed by part of one
        for call in (
            lambda: decode_run(short, 0, MemoryMessageId, Filter.everything()),
            lambda: decode_run(encoded + short, 0, MemoryMessageId, Filter.everything()),
            lambda: decode_run(encoded + short, 0, MemoryMessageId, Filter(types=[]), skip=1),
            lambda: count_run(encoded + short),
        ):
            with pytest.raises(CorruptRecord):
                call()
    # An empty run is a valid run of no records.
    assert decode_run(b"", 0, MemoryMessageId, Filter.everything()) == []


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(envelopes(), st.data())
def test_a_flipped_byte_is_corrupt_or_changes_only_what_it_encodes(
    envelope: tuple[Message, dict[str, Any], bytes], data: st.DataObject
) -> None:
    _, _, encoded = envelope
    position = data.draw(st.integers(0, len(encoded) - 1), label="position")
    mask = data.draw(st.integers(1, 255), label="mask")
    flipped = bytearray(encoded)
    flipped[position] ^= mask
    damaged = bytes(flipped)
    original = decode(encoded, MemoryMessageId(5))

    got = _outcome(decode, damaged, MemoryMessageId(5))
    header = _outcome(peek, damaged)
    if position in _MUST_REJECT:
        assert got is None, f"decode accepted damage to header byte {position}"
        assert header is None, f"peek accepted damage to header byte {position}"
    allowed = _fields_fed_by(encoded, position)
    if got is not None:
        changed = {k for k, v in fields(got).items() if fields(original)[k] != v}
        assert changed <= allowed, f"byte {position} changed {changed - allowed}"
    if header is not None:
        seen = {
            "type": header.type,
            "vchannel": header.vchannel,
            "timetick": header.timetick,
            "term": header.term,
            "payload": bytes(header.payload),
        }
        changed = {k for k, v in seen.items() if fields(original)[k] != v}
        assert changed <= allowed, f"byte {position} changed {changed - allowed} in peek"

    run = _outcome(decode_run, encoded + damaged, 9, MemoryMessageId, Filter.everything())
    if run is not None:
        assert len(run) == 2
        assert fields(run[0]) == {**fields(original), "message_id": MemoryMessageId(9)}
    _outcome(count_run, damaged + encoded)


@given(st.binary(max_size=200))
@example(b"")
@example(bytes(HEADER_SIZE))
@example(b"\x01" + bytes(HEADER_SIZE))
def test_garbage_is_corrupt_never_another_error(garbage: bytes) -> None:
    for prefix in (b"", struct.pack("<BBHI", VERSION, 0, 2, len(garbage) + 8)):
        blob = prefix + garbage
        _outcome(decode, blob, MemoryMessageId(0))
        _outcome(peek, blob)
        _outcome(decode_run, blob, 0, MemoryMessageId, Filter.everything())
        _outcome(decode_run, blob, 0, MemoryMessageId, Filter(vchannels=["x"], types=[2]))
        _outcome(count_run, blob)


@given(st.integers(0, 255).filter(lambda v: v != VERSION))
def test_unknown_version_is_corrupt(version: int) -> None:
    data = bytearray(encode(Message(payload=b"p", vchannel="v"), timetick=1, term=1))
    data[0] = version
    for call in (
        lambda: decode(bytes(data), MemoryMessageId(0)),
        lambda: peek(bytes(data)),
        lambda: decode_run(bytes(data), 0, MemoryMessageId, Filter.everything()),
        lambda: count_run(bytes(data)),
    ):
        with pytest.raises(CorruptRecord, match=r"version|bad record"):
            call()


def test_unknown_message_type_is_corrupt() -> None:
    data = bytearray(encode(Message(payload=b"p", vchannel="v"), timetick=1, term=1))
    struct.pack_into("<H", data, 2, 12)  # 12 is neither a Milvus type nor an app type
    with pytest.raises(CorruptRecord, match="unknown message type 12"):
        decode(bytes(data), MemoryMessageId(0))
    with pytest.raises(CorruptRecord, match="unknown message type 12"):
        peek(bytes(data))


def test_stray_bytes_after_an_envelope_are_corrupt() -> None:
    data = encode(Message(payload=b"p", vchannel="v"), timetick=1, term=1)
    with pytest.raises(CorruptRecord, match="stray"):
        decode(data + b"\x00", MemoryMessageId(0))
    with pytest.raises(CorruptRecord, match="stray"):
        peek(data + b"\x00")


def test_a_wrong_vchannel_hash_is_corrupt_whatever_was_decoded_before() -> None:
    """Decoding must not depend on what the process decoded earlier: a name whose stored
    hash does not match is corrupt even when the name itself was seen (and cached)."""
    good = encode(Message(payload=b"", vchannel="seen-before"), timetick=1, term=1)
    decode(good, MemoryMessageId(0))  # the name is now known to the decoder
    bad = bytearray(good)
    bad[8] ^= 0x01  # the stored vchannel hash
    with pytest.raises(CorruptRecord, match="hash"):
        decode(bytes(bad), MemoryMessageId(0))
    with pytest.raises(CorruptRecord, match="hash"):
        peek(bytes(bad))


@pytest.mark.parametrize("where", ["key", "value", "idempotency_key"])
def test_bad_utf8_in_the_ext_section_is_corrupt(where: str) -> None:
    """msgspec reports bad UTF-8 in a msgpack str as UnicodeDecodeError, not DecodeError."""
    fields = {"key": ("\u00e9", "v", None), "value": ("k", "\u00e9", None)}
    key, value, ikey = fields.get(where, ("k", "v", "\u00e9"))
    data = encode(
        Message(payload=b"p", vchannel="v", properties={key: value}, idempotency_key=ikey),
        timetick=1,
        term=1,
    )
    damaged = data.replace("\u00e9".encode(), b"\xc0\xc0")  # same length, not UTF-8
    assert damaged != data
    with pytest.raises(CorruptRecord, match="ext section"):
        decode(damaged, MemoryMessageId(0))


@pytest.mark.parametrize("replacement", ["memorx:3", "file:333", "kafka:33", "pulsar:3"])
def test_a_damaged_last_confirmed_id_is_corrupt(replacement: str) -> None:
    """The last-confirmed id in a record is the log's own kind of id; anything else is a
    damaged record (CorruptRecord), not an unknown backend or an import error."""
    data = encode(
        Message(payload=b"p", vchannel="v"),
        timetick=1,
        term=1,
        last_confirmed=MemoryMessageId(3),
    )
    damaged = data.replace(b"memory:3", replacement.encode())  # same length: lengths hold
    assert len(damaged) == len(data)
    assert damaged != data
    with pytest.raises(CorruptRecord):
        decode(damaged, MemoryMessageId(0))


@pytest.mark.parametrize("key", [None, "k"])
def test_a_last_confirmed_id_of_another_log_is_corrupt_after_it_was_read_in_its_own(
    key: str | None,
) -> None:
    """Decoding remembers the last-confirmed ids it parsed (keyed records, each ext its
    own, share them): an id read in a file log first is still not a memory log's."""
    message = Message(payload=b"p", vchannel="v", idempotency_key=key)
    in_file = encode(message, timetick=1, term=1, last_confirmed=FileMessageId(333))
    assert decode(in_file, FileMessageId(334)).last_confirmed_id == FileMessageId(333)
    for _ in range(2):
        with pytest.raises(CorruptRecord, match="not an id of this log"):
            decode(in_file, MemoryMessageId(334))


# ---------------------------------------------------------------------------------------
# decode_run against a reference model of filtering

_POOL_VCHANNELS = ["", "a", "b", "plumless", "buckeroo"]  # the last two share a CRC-32
_POOL_TYPES = [
    MessageType.TIME_TICK,
    MessageType.INSERT,
    MessageType.DELETE,
    MessageType.BEGIN_TXN,
    MessageType.COMMIT_TXN,
    MessageType.ROLLBACK_TXN,
    MessageType.TXN,
    MessageType.CREATE_COLLECTION,
    MessageType(10_000),
]
_SYSTEM = {1, 900, 901, 902, 999}  # spelled out: the model must not reuse walsvc's code


class _Model:
    """A filter as the specification states it."""

    def __init__(
        self, vchannels: frozenset[str] | None, types: frozenset[int] | None, floor: int
    ) -> None:
        self.vchannels, self.types, self.floor = vchannels, types, floor

    def admits(self, message: ImmutableMessage) -> bool:
        return (
            (self.vchannels is None or message.vchannel == "" or message.vchannel in self.vchannels)
            and (self.types is None or int(message.type) in self.types or message.type in _SYSTEM)
            and message.timetick >= self.floor
        )

    def filter(self) -> Filter:
        return Filter(vchannels=self.vchannels, types=self.types, min_timetick=self.floor)


models = st.builds(
    _Model,
    st.none() | st.frozensets(st.sampled_from([*_POOL_VCHANNELS[1:], "c"]), max_size=3),
    st.none() | st.frozensets(st.sampled_from([*(int(t) for t in _POOL_TYPES), 3, 77]), max_size=4),
    st.integers(0, 12),
)
pool_messages = st.builds(
    Message,
    payload=st.binary(max_size=20),
    vchannel=st.sampled_from(_POOL_VCHANNELS),
    type=st.sampled_from(_POOL_TYPES),
    properties=st.dictionaries(st.sampled_from(["k", "l"]), TEXT, max_size=2),
)


@given(
    st.lists(st.tuples(pool_messages, st.integers(0, 12)), max_size=14),
    st.lists(models, min_size=0, max_size=3),
    st.integers(0, 16),
    st.integers(0, 2**40),
    st.binary(max_size=40),
    st.binary(max_size=40),
)
def test_decode_run_equals_decoding_everything_and_filtering(
    items: list[tuple[Message, int]],
    filters: list[_Model],
    skip: int,
    first_seq: int,
    before: bytes,
    after: bytes,
) -> None:
    records = [encode(m, timetick=tick, term=1) for m, tick in items]
    run = b"".join(records)
    everything = [decode(r, MemoryMessageId(first_seq + i)) for i, r in enumerate(records)]
    expected = [
        m
        for i, m in enumerate(everything)
        if i >= skip and all(model.admits(m) for model in filters)
    ]
    selected = Filter.combine(model.filter() for model in filters)

    assert decode_run(run, first_seq, MemoryMessageId, selected, skip=skip) == expected
    # The same run inside a larger buffer, read between start and end.
    padded = before + run + after
    assert (
        decode_run(
            memoryview(padded),
            first_seq,
            MemoryMessageId,
            selected,
            start=len(before),
            end=len(before) + len(run),
            skip=skip,
        )
        == expected
    )
    assert count_run(padded, len(before), len(before) + len(run)) == len(records)


def test_decode_run_checks_names_behind_a_hash_collision() -> None:
    assert walsvc.core._filter.vchannel_hash(b"plumless") == walsvc.core._filter.vchannel_hash(
        b"buckeroo"
    )
    run = b"".join(
        encode(Message(payload=b"", vchannel=v), timetick=1, term=1)
        for v in ("plumless", "buckeroo", "")
    )
    got = decode_run(run, 0, MemoryMessageId, Filter(vchannels=["plumless"]))
    assert [(m.message_id.seq, m.vchannel) for m in got] == [(0, "plumless"), (2, "")]


def test_decode_run_skip_past_the_end_gives_nothing() -> None:
    run = encode(Message(payload=b"", vchannel="a"), timetick=1, term=1) * 3
    assert decode_run(run, 0, MemoryMessageId, Filter.everything(), skip=5) == []
    got = decode_run(run, 10, MemoryMessageId, Filter(), skip=2)
    assert [m.message_id.seq for m in got] == [12]


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
