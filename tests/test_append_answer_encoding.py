"""The node's compiled append conversions (``walsvc/service/_cwire.c``): the ``Appended``
answers it writes are, byte for byte, what the Python path (``wire_result`` and msgspec)
writes, and the ``Message``s it builds from ``WireMessage``s are the ones ``message_of``
builds, checked as ``Message.__post_init__`` checks them; whatever it declines takes the
Python path, which gives the same bytes or raises the same error."""

from __future__ import annotations

import gc
import sys
from typing import Any, ClassVar

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from walsvc import AppendResult, InvalidMessage, Message, MessageType
from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._kafka._ids import KafkaMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.backends._pulsar._ids import PulsarMessageId
from walsvc.core._ids import SequenceMessageId
from walsvc.core._message import _MAX_VCHANNEL_BYTES
from walsvc.remote._protocol import Appended, NodeMessage, WireMessage, array_header
from walsvc.service import _wire


class _LongSchemeId(SequenceMessageId, frozen=True, gc=False):
    """An id whose text can pass 31 bytes: msgpack's str 8 header, not a fixstr."""

    scheme: ClassVar[str] = "a-scheme-of-twenty-six-bytes"


SCHEMES: dict[type, bytes] = {
    FileMessageId: b"file:",
    MemoryMessageId: b"memory:",
    KafkaMessageId: b"kafka:",
    _LongSchemeId: f"{_LongSchemeId.scheme}:".encode(),
}
_decode = msgspec.msgpack.Decoder(list[NodeMessage]).decode

# Where msgpack's int formats change, and where a decimal gains a digit.
_POSITIVE_EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63]
_NEGATIVE_EDGES = [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.sampled_from(
    [*_POSITIVE_EDGES, 2**64 - 1, *_NEGATIVE_EDGES]
)
_DECIMAL_EDGES = [10**k + d for k in range(19) for d in (-1, 0)] + [2**63 - 1, -(2**63)]
_SEQS = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.sampled_from(
    _DECIMAL_EDGES + [-n for n in _DECIMAL_EDGES if n > 0]
)


def _ids() -> st.SearchStrategy[Any]:
    return st.builds(lambda cls, seq: cls(seq), st.sampled_from(list(SCHEMES)), _SEQS)


RESULTS = st.builds(
    AppendResult,
    message_id=_ids(),
    timetick=_INTS,
    last_confirmed_id=st.none() | _ids(),
)


def _python(request: int, results: list[AppendResult]) -> bytes:
    return _wire.encode(Appended(request, [_wire.wire_result(r) for r in results]))


def test_the_compiled_append_conversions_are_built() -> None:
    """``make test`` builds walsvc/service/_cwire.c; without it the node spends about
    0.9 us more CPU per appended message."""
    assert _wire.compiled


@given(_INTS, st.lists(RESULTS, max_size=20))
@example(0, [])
@example(2**64 - 1, [AppendResult(MemoryMessageId(0), 0)] * 15)
@example(-(2**63), [AppendResult(MemoryMessageId(0), 0)] * 16)
@example(1, [AppendResult(_LongSchemeId(-(2**63)), 1, _LongSchemeId(2**63 - 1))])
def test_the_compiled_appended_bytes_are_the_python_bytes(
    request: int, results: list[AppendResult]
) -> None:
    compiled = _wire._cwire.encode_appended(request, results, SCHEMES)
    assert compiled is not None
    assert compiled == _python(request, results)


def test_a_long_answer_takes_the_32_bit_array_header() -> None:
    results = [AppendResult(FileMessageId(i), i, FileMessageId(i // 300)) for i in range(65536)]
    compiled = _wire._cwire.encode_appended(3, results, SCHEMES)
    assert compiled is not None
    assert compiled == _python(3, results)


def _result(**changes: Any) -> AppendResult:
    fields: dict[str, Any] = {
        "message_id": MemoryMessageId(7),
        "timetick": 5,
        "last_confirmed_id": MemoryMessageId(3),
    }
    fields.update(changes)
    return AppendResult(**fields)


class _SubResult(AppendResult, frozen=True, gc=False):
    pass


_DECLINED = [
    _result(message_id=PulsarMessageId(1, 2, -1)),  # not a sequence id
    _result(last_confirmed_id=PulsarMessageId(1, 2, -1)),
    _result(message_id=MemoryMessageId(2**63)),  # a number beyond 64 bits: text all the same
    _result(last_confirmed_id=MemoryMessageId(-(2**63) - 1)),
    _result(timetick=2**64),  # beyond msgpack's 64 bits: msgspec raises
    _result(timetick=-(2**63) - 1),
    _result(timetick=True),  # msgspec writes a bool, not an int
    _SubResult(MemoryMessageId(1), 2, None),  # not an AppendResult itself
]


@pytest.mark.parametrize("declined", _DECLINED)
def test_what_the_compiled_answer_declines_goes_the_python_way(declined: AppendResult) -> None:
    """The compiled walk declines (None) what it does not take; ``encode_appended``
    then gives what the Python path gives, or raises what it raises."""
    batch = [_result(), declined]
    assert _wire._cwire.encode_appended(1, batch, SCHEMES) is None
    try:
        expected: bytes | type[Exception] = _python(1, batch)
    except Exception as exc:
        expected = type(exc)
    if isinstance(expected, bytes):
        assert _wire.encode_appended(1, batch) == expected
    else:
        with pytest.raises(expected):
            _wire.encode_appended(1, batch)


def test_a_request_beyond_64_bits_is_declined() -> None:
    assert _wire._cwire.encode_appended(2**64, [_result()], SCHEMES) is None
    with pytest.raises(OverflowError):
        _wire.encode_appended(2**64, [_result()])


def test_an_id_class_is_learned_at_its_first_answer() -> None:
    """``encode_appended`` teaches the compiled path each sequence id class as it meets
    it, as ``encode_delivered`` does (they share what they learned)."""
    results = [AppendResult(KafkaMessageId(9), 1, KafkaMessageId(8))]
    _wire._schemes.pop(KafkaMessageId, None)
    assert _wire._cwire.encode_appended(2, results, _wire._schemes) is None
    assert _wire.encode_appended(2, results) == _python(2, results)
    assert _wire._schemes[KafkaMessageId] == b"kafka:"
    assert _wire._cwire.encode_appended(2, results, _wire._schemes) == _python(2, results)


def test_the_client_decodes_the_compiled_answer() -> None:
    results = [_result(), _result(last_confirmed_id=None)]
    compiled = _wire._cwire.encode_appended(4, results, SCHEMES)
    assert compiled is not None
    (appended,) = _decode(array_header(1) + compiled)
    assert appended == Appended(4, [_wire.wire_result(r) for r in results])


_OUTCOMES = RESULTS | st.sampled_from([InvalidMessage("bad"), RuntimeError("boom")])


def _python_each(requests: list[int], outcomes: list[Any]) -> list[bytes | None]:
    return [
        _python(request, [outcome]) if type(outcome) is AppendResult else None
        for request, outcome in zip(requests, outcomes, strict=True)
    ]


@given(st.lists(st.tuples(_INTS, _OUTCOMES), max_size=40))
@example([])
@example([(1, RuntimeError("boom"))])
def test_a_groups_answers_are_the_python_answers(pairs: list[tuple[int, Any]]) -> None:
    """``encode_appended_each``: each successful append's ``Appended`` as its own bytes,
    None where the outcome is an error (answered with ``Failed``)."""
    requests = [request for request, _ in pairs]
    outcomes = [outcome for _, outcome in pairs]
    compiled = _wire._cwire.encode_appended_each(requests, outcomes, SCHEMES)
    assert compiled == _python_each(requests, outcomes)


@pytest.mark.parametrize("declined", _DECLINED[:2] + _DECLINED[4:5])
def test_a_group_with_a_declined_result_goes_the_python_way(declined: AppendResult) -> None:
    requests, outcomes = [1, 2, 3], [_result(), RuntimeError("x"), declined]
    assert _wire._cwire.encode_appended_each(requests, outcomes, SCHEMES) is None
    try:
        expected: list[bytes | None] | type[Exception] = _python_each(requests, outcomes)
    except Exception as exc:
        expected = type(exc)
    if isinstance(expected, list):
        assert _wire.encode_appended_each(requests, outcomes) == expected
    else:
        with pytest.raises(expected):
            _wire.encode_appended_each(requests, outcomes)


def test_a_group_of_unequal_lists_is_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        _wire._cwire.encode_appended_each([1, 2], [_result()], SCHEMES)


# -- Messages from the wire ---------------------------------------------------------------

_SURROGATES = ["\ud800", "a\udfffb", "\udbff"]
# Lengths where the vchannel limit (65,535 UTF-8 bytes) is met or passed.
_LONG_VCHANNELS = [
    "v" * _MAX_VCHANNEL_BYTES,
    "v" * (_MAX_VCHANNEL_BYTES + 1),
    "é" * (_MAX_VCHANNEL_BYTES // 2) + "v",  # 65,535 bytes
    "é" * (_MAX_VCHANNEL_BYTES // 2 + 1),  # 65,536 bytes in 32,768 characters
    "€" * (_MAX_VCHANNEL_BYTES // 3),  # 65,535 bytes
    "€" * (_MAX_VCHANNEL_BYTES // 3) + "v",
    "\U0001f600" * (_MAX_VCHANNEL_BYTES // 4) + "vvv",
    "\U0001f600" * (_MAX_VCHANNEL_BYTES // 4 + 1),
]
_TEXT = st.text(max_size=12)
_ODD_TEXT = st.sampled_from(_SURROGATES)
_VCHANNELS = _TEXT | _ODD_TEXT | st.sampled_from(_LONG_VCHANNELS)
_TYPES = (
    st.sampled_from([int(t) for t in MessageType])
    | st.integers(min_value=10_000, max_value=65_535)  # the application range
    | st.sampled_from([10_000, 65_535, 0, 12, 9_999, 65_536, -1, 2**70])  # its edges, unknowns
)
_PROPERTIES = st.dictionaries(_TEXT | _ODD_TEXT, _TEXT | _ODD_TEXT, max_size=4)
WIRES = st.builds(
    WireMessage,
    payload=st.binary(max_size=32),
    vchannel=_VCHANNELS,
    type=_TYPES,
    properties=st.just({}) | _PROPERTIES,
    idempotency_key=st.none() | _TEXT | _ODD_TEXT | _TEXT.map(lambda k: "~p." + k),
)


def _python_messages(wires: list[WireMessage]) -> list[Message] | type[Exception]:
    try:
        return [_wire.message_of(w) for w in wires]
    except Exception as exc:
        return type(exc)


def _hash(m: Message) -> int | str:
    try:
        return hash(m)
    except TypeError as exc:
        return str(exc)


def _assert_same_messages(built: list[Message], expected: list[Message]) -> None:
    assert built == expected
    for m, e in zip(built, expected, strict=True):
        assert type(m) is Message
        assert type(m.type) is MessageType
        assert m.type is e.type
        assert type(m.properties) is dict
        assert m.properties is e.properties
        assert m.payload is e.payload
        assert m.vchannel is e.vchannel
        assert m.idempotency_key is e.idempotency_key
        assert m.txn is None
        assert _hash(m) == _hash(e)  # a dict field: both unhashable
        assert repr(m) == repr(e)
        assert msgspec.msgpack.encode(m) == msgspec.msgpack.encode(e)
        assert gc.is_tracked(m) == gc.is_tracked(e)
        assert gc.get_referents(m) == gc.get_referents(e)


@given(st.lists(WIRES, max_size=8))
@example([])
@example([WireMessage(b"x", "v", 2, {}, None)])
def test_the_compiled_messages_are_message_ofs(wires: list[WireMessage]) -> None:
    """``messages_of`` gives the Messages ``message_of`` gives, or raises what it raises;
    the compiled path takes every list that ``Message`` accepts whose types it knows."""
    expected = _python_messages(wires)
    types = dict(_wire._TYPES)
    types.update((w.type, MessageType(w.type)) for w in wires if 10_000 <= w.type <= 65_535)
    compiled = _wire._cwire.messages_of(wires, types)
    if isinstance(expected, list):
        assert compiled is not None
        _assert_same_messages(compiled, expected)
        _assert_same_messages(_wire.messages_of(wires), expected)
    else:
        assert compiled is None
        assert expected is InvalidMessage
        with pytest.raises(InvalidMessage):
            _wire.messages_of(wires)


@given(st.lists(WIRES, max_size=8))
def test_the_compiled_charge_is_the_python_charge(wires: list[WireMessage]) -> None:
    """``charge_of``: 64 a message plus its payload's bytes, compiled or not; a payload
    that is not bytes itself goes the Python way."""
    expected = sum(64 + len(w.payload) for w in wires)
    assert _wire._cwire.charge_of(wires) == expected
    assert _wire.charge_of(wires) == expected
    odd = [*wires, WireMessage(bytearray(b"xy"), "v", 2, {}, None)]
    assert _wire._cwire.charge_of(odd) == -1
    assert _wire.charge_of(odd) == expected + 66


_VALID = WireMessage(b"x", "v", 2, {}, "~p.1")


@pytest.mark.parametrize(
    "declined",
    [
        WireMessage(bytearray(b"x"), "v", 2, {}, None),  # not bytes: Message refuses it
        WireMessage(b"x", b"v", 2, {}, None),  # type: ignore[arg-type]
        WireMessage(b"x", "v", True, {}, None),  # a bool: message_of maps it as 1
        WireMessage(b"x", "v", 2.0, {}, None),  # type: ignore[arg-type]
        WireMessage(b"x", "v", 2, {"k": 1}, None),  # type: ignore[dict-item]
        WireMessage(b"x", "v", 2, {"k": "\ud800"}, None),
        WireMessage(b"x", "v", 2, [], None),  # type: ignore[arg-type]
        WireMessage(b"x", "v", 2, {}, b"key"),  # type: ignore[arg-type]
        WireMessage(b"x", "v", 2, {}, "\udfff"),
        WireMessage(b"x", "\ud800", 2, {}, None),
        WireMessage(b"x", "v" * (_MAX_VCHANNEL_BYTES + 1), 2, {}, None),
        WireMessage(b"x", "v", 9_999, {}, None),  # below the application range
        Message(payload=b"x", vchannel="v"),  # not a WireMessage
    ],
)
def test_what_the_compiled_messages_decline_goes_the_python_way(declined: Any) -> None:
    wires = [_VALID, declined]
    assert _wire._cwire.messages_of(wires, _wire._TYPES) is None
    expected = _python_messages(wires)
    if isinstance(expected, list):
        assert _wire.messages_of(wires) == expected
    else:
        with pytest.raises(expected):
            _wire.messages_of(wires)
    assert _wire.compiled_messages_of(wires) is None


def test_an_application_type_is_learned_at_its_first_message() -> None:
    wires = [WireMessage(b"x", "v", 54_321, {}, None)]
    _wire._TYPES.pop(54_321, None)
    assert _wire._cwire.messages_of(wires, _wire._TYPES) is None
    assert _wire.messages_of(wires) == [_wire.message_of(wires[0])]
    assert _wire._TYPES[54_321] is MessageType(54_321)
    built = _wire._cwire.messages_of(wires, _wire._TYPES)
    assert built is not None
    _assert_same_messages(built, [_wire.message_of(wires[0])])


def test_decoded_wire_messages_take_the_compiled_path() -> None:
    """What the node decodes from a frame, with properties, keys and non-ASCII text."""
    sent = [
        WireMessage(b"p" * n, f"vé{n}", 2, {"a": "β", "ключ": "v"}, f"~p.{n}") for n in range(20)
    ]
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(sent), type=list[WireMessage])
    built = _wire._cwire.messages_of(decoded, _wire._TYPES)
    assert built is not None
    _assert_same_messages(built, [_wire.message_of(w) for w in decoded])


def test_built_messages_live_and_die_as_python_built_ones() -> None:
    """Many compiled Messages through full collections: each holds its fields, the
    collector sees them, and freeing them gives back every reference they took."""
    payload = b"payload-" + bytes(8)
    properties = {"k": "v"}
    wires = [
        WireMessage(payload, f"v{i % 7}", 2, properties if i % 2 else {}, f"~p.{i}")
        for i in range(5000)
    ]
    before = (sys.getrefcount(payload), sys.getrefcount(properties), sys.getrefcount(Message))
    kept = []
    for _ in range(4):
        built = _wire._cwire.messages_of(wires, _wire._TYPES)
        assert built is not None
        kept.append(built)
        gc.collect()
    expected = [_wire.message_of(w) for w in wires]
    for built in kept:
        _assert_same_messages(built[:50], expected[:50])
        assert built == expected
        assert {repr(m) for m in built} == {repr(m) for m in expected}
    del kept, built, expected
    gc.collect()
    after = (sys.getrefcount(payload), sys.getrefcount(properties), sys.getrefcount(Message))
    assert after == before
