"""The record walk of Kafka fetch responses (walsvc.backends._kafka._batches).

Batches are built with aiokafka's own DefaultRecordBatchBuilder (what its producer
sends), so the bytes are Kafka's format, not walsvc's idea of it. The compiled walk must
give exactly what aiokafka's parser gives, record for record, and refuse exactly what it
refuses, with CorruptRecord and nothing else.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walsvc import CorruptRecord
from walsvc.backends._kafka import _batches
from walsvc.backends._kafka._records import ENVELOPE_HEADER, EXPECTED

_OFFSET = struct.Struct(">q")
_GZIP = 1
_CONTROL = 0x20

Header = tuple[str, bytes | None]
Record = tuple[list[Header], bytes | None]


def batch(
    base: int, records: list[Record], *, compression: int = 0, control: bool = False
) -> bytes:
    """One v2 record batch at ``base``, record i at offset base + i."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for i, (headers, value) in enumerate(records):
        builder.append(i, timestamp=None, key=None, value=value, headers=headers)
    data = bytearray(builder.build())
    _OFFSET.pack_into(data, 0, base)
    if control:  # aiokafka builds no control batches: set the flag, then the CRC again
        data[22] |= _CONTROL
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def data_record(expected: int, head: bytes, value: bytes | None) -> Record:
    return [(EXPECTED, _OFFSET.pack(expected)), (ENVELOPE_HEADER, head)], value


def walk_in_python(data: bytes, fetch_offset: int) -> tuple[list[_batches.Walked], int]:
    out: list[_batches.Walked] = []
    return out, _batches.walk_batches_in_python(data, 0, fetch_offset, fetch_offset, out)[1]


def outcome(walker: object, data: bytes, fetch_offset: int) -> object:
    """What ``walker`` gives, or the text of the CorruptRecord it raises."""
    try:
        return walker(data, fetch_offset)  # type: ignore[operator]
    except CorruptRecord as exc:
        return f"CorruptRecord: {exc}"


def test_the_compiled_walk_is_built() -> None:
    """make test runs where a C compiler is; without it the scanner would be slow."""
    assert _batches._compiled_walk is not None


def test_data_records_come_back_as_their_envelope_header_the_rest_with_their_headers() -> None:
    records = [
        data_record(10, b"H10", b"v10"),
        ([("walsvc.barrier", b"")], None),
        data_record(99, b"stale", b"x"),  # landed elsewhere than expected
        data_record(13, b"H13", None),
    ]
    got, after = _batches.walk(batch(10, records), 10)
    assert got == [
        (10, b"H10", b"v10"),
        (11, [("walsvc.barrier", b"")], None),
        (12, [(EXPECTED, _OFFSET.pack(99)), (ENVELOPE_HEADER, b"stale")], b"x"),
        (13, b"H13", None),
    ]
    assert after == 14


def test_records_before_the_fetch_offset_are_left_out_but_their_batch_counts() -> None:
    data = batch(10, [data_record(10 + i, b"H", b"v") for i in range(5)])
    got, after = _batches.walk(data, 13)
    assert [offset for offset, _, _ in got] == [13, 14]
    assert after == 15


def test_a_batch_cut_short_is_left_for_the_next_fetch() -> None:
    first = batch(0, [data_record(0, b"H", b"v")])
    second = batch(1, [data_record(1, b"H", b"v")])
    for cut in range(1, len(second)):
        got, after = _batches.walk(first + second[:cut], 0)
        assert [offset for offset, _, _ in got] == [0]
        assert after == 1
    assert _batches.walk(b"", 7) == ([], 7)


def test_control_and_compressed_batches() -> None:
    data = (
        batch(0, [data_record(0, b"H0", b"v0")])
        + batch(1, [([("k", b"\0\0\0\0")], None)], control=True)
        + batch(2, [data_record(2, b"H2", b"v2"), data_record(3, b"H3", b"v3")], compression=_GZIP)
        + batch(4, [data_record(4, b"H4", b"v4")])
    )
    got, after = _batches.walk(data, 0)
    assert [(offset, head) for offset, head, _ in got] == [
        (0, b"H0"),
        (2, b"H2"),
        (3, b"H3"),
        (4, b"H4"),
    ]
    assert after == 5
    assert walk_in_python(data, 0) == (got, after)


@pytest.mark.parametrize("where", [17, 25, 61, -1])
def test_a_crc_mismatch_is_corrupt(where: int) -> None:
    """Bytes under the CRC (the CRC itself, attributes, a record) fail the check."""
    data = bytearray(batch(5, [data_record(5, b"H", b"value")]))
    data[where] ^= 0x01
    with pytest.raises(CorruptRecord, match="offset 5: CRC-32C mismatch"):
        _batches.walk(bytes(data), 5)


@pytest.mark.parametrize(
    ("length", "error"),
    [(-1, "negative batch length"), (3, "too short for its magic"), (30, "length too small")],
)
def test_impossible_batch_lengths_are_corrupt(length: int, error: str) -> None:
    data = bytearray(batch(5, [data_record(5, b"H", b"value")]))
    struct.pack_into(">i", data, 8, length)
    with pytest.raises(CorruptRecord, match=error):
        _batches.walk(bytes(data), 0)
    with pytest.raises(CorruptRecord, match=error):
        walk_in_python(bytes(data), 0)


def test_a_record_that_does_not_fit_its_batch_is_corrupt() -> None:
    """A record count one too high, CRC made right: the batch ends before the record."""
    data = bytearray(batch(5, [data_record(5, b"H", b"value")]))
    struct.pack_into(">i", data, 57, 2)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    for walker in (_batches.walk, walk_in_python):
        with pytest.raises(CorruptRecord, match="offset 5"):
            walker(bytes(data), 5)


headers = st.lists(
    st.tuples(
        st.sampled_from([EXPECTED, ENVELOPE_HEADER, "walsvc.barrier", "k", "é"]),
        st.one_of(st.none(), st.binary(max_size=12)),
    ),
    max_size=3,
)
values = st.one_of(st.none(), st.binary(max_size=40))


@st.composite
def record_lists(draw: st.DrawFn, base: int) -> list[Record]:
    """Records of a batch at ``base``: mostly walsvc data records, right or wrong about
    their offset, and records with any headers."""
    out: list[Record] = []
    for i in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            expected = base + i + draw(st.sampled_from([0, 0, 0, 1, -1]))
            out.append(data_record(expected, draw(st.binary(max_size=20)), draw(values)))
        else:
            out.append((draw(headers), draw(values)))
    return out


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, int]:
    """Record batches as a fetch response holds them, and a fetch offset into them."""
    data = b""
    base = draw(st.integers(0, 1 << 40))
    first = base
    for _ in range(draw(st.integers(1, 4))):
        records = draw(record_lists(base))
        kind = draw(st.sampled_from(["plain", "plain", "gzip", "control"]))
        data += batch(
            base, records, compression=_GZIP if kind == "gzip" else 0, control=kind == "control"
        )
        base += len(records) + draw(st.integers(0, 3))  # compaction may leave gaps
    return data, draw(st.integers(first, base))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.data())
def test_the_compiled_walk_gives_what_aiokafkas_parser_gives(
    response: tuple[bytes, int], data: st.DataObject
) -> None:
    """Whole responses, responses cut anywhere, and responses with one byte flipped: the
    same records and next offset, or the same CorruptRecord."""
    raw, fetch_offset = response
    assert outcome(_batches.walk, raw, fetch_offset) == outcome(walk_in_python, raw, fetch_offset)
    cut = raw[: data.draw(st.integers(0, len(raw)))]
    assert outcome(_batches.walk, cut, fetch_offset) == outcome(walk_in_python, cut, fetch_offset)
    flipped = bytearray(raw)
    flipped[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    compiled = outcome(_batches.walk, bytes(flipped), fetch_offset)
    python = outcome(walk_in_python, bytes(flipped), fetch_offset)
    assert compiled == python
