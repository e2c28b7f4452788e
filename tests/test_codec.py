"""Property tests of reading one envelope (``walsvc.core._codec``): round trips through
``encode``, ``decode``, ``decode_split`` and the zero-copy ``peek``, the fixed layout, and
hostile bytes (truncations, flipped bytes, garbage, damaged fields), which give
``CorruptRecord``, also from a run holding the damaged envelope, never another error."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from _envelope_strategies import IDS, envelopes
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from walsvc import CorruptRecord, Filter, ImmutableMessage, Message, MessageType, TxnContext
from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._codec import HEADER_SIZE, VERSION, decode, decode_split, peek
from walsvc.core._encode import encode
from walsvc.core._runs import count_run, decode_run


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
