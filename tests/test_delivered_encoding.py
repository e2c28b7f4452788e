"""The node's compiled encoding of delivered messages (``walsvc/service/_cwire.c``)
writes, byte for byte, what the Python path (``wire_delivered`` and msgspec) writes, and
declines what it does not take, so that ``encode_delivered`` gives the same bytes
either way."""

from __future__ import annotations

import types
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from walsvc import ImmutableMessage, MessageType
from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._kafka._ids import KafkaMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.backends._pulsar._ids import PulsarMessageId
from walsvc.core._message import TxnContext
from walsvc.remote._protocol import PRODUCER_KEY_PREFIX, Delivered, NodeMessage, array_header
from walsvc.service import _wire

SCHEMES: dict[type, bytes] = {
    FileMessageId: b"file:",
    MemoryMessageId: b"memory:",
    KafkaMessageId: b"kafka:",
}
_decode = msgspec.msgpack.Decoder(list[NodeMessage]).decode

# Lengths where msgpack changes format (fix, 8-, 16- and 32-bit lengths).
_EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]
_INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_POSITIVE_EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63]
_NEGATIVE_EDGES = [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
_INT_EDGES = st.sampled_from([*_POSITIVE_EDGES, 2**64 - 1, *_NEGATIVE_EDGES])
_INTS = _INT64 | _INT_EDGES
_TEXT = st.text(max_size=40) | st.sampled_from(_EDGES).map(lambda n: "é" * (n // 2) + "x" * (n % 2))


def _ids() -> st.SearchStrategy[Any]:
    return st.builds(
        lambda cls, seq: cls(seq),
        st.sampled_from(list(SCHEMES)),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
    )


def _properties() -> st.SearchStrategy[Any]:
    plain = st.dictionaries(_TEXT, _TEXT, max_size=18)
    return plain | plain.map(types.MappingProxyType)


def _message(body: st.SearchStrategy[tuple[ImmutableMessage, ...]]) -> st.SearchStrategy[Any]:
    return st.builds(
        ImmutableMessage,
        message_id=_ids(),
        timetick=_INTS,
        vchannel=_TEXT,
        type=st.sampled_from(list(MessageType)),
        payload=st.binary(max_size=64) | st.sampled_from(_EDGES).map(lambda n: b"p" * n),
        properties=_properties(),
        last_confirmed_id=st.none() | _ids(),
        txn=st.none() | st.builds(TxnContext, _INTS, _INTS),
        idempotency_key=st.none() | _TEXT | _TEXT.map(lambda k: PRODUCER_KEY_PREFIX + k),
        term=_INTS,
        persisted=st.booleans(),
        body=body,
        durable_tick=_INTS,
    )


MESSAGES = _message(st.lists(_message(st.just(())), max_size=3).map(tuple))


def _python(stream: int, messages: list[ImmutableMessage]) -> bytes:
    return _wire.encode(Delivered(stream, [_wire.wire_delivered(m) for m in messages]))


def test_the_compiled_delivered_encoding_is_built() -> None:
    """``make test`` builds walsvc/service/_cwire.c; without it the node spends about
    seven times the CPU per delivered message."""
    assert _wire.compiled


@given(st.integers(min_value=0, max_value=2**63 - 1), st.lists(MESSAGES, max_size=20))
@example(0, [])
def test_the_compiled_bytes_are_the_python_bytes(
    stream: int, messages: list[ImmutableMessage]
) -> None:
    compiled = _wire._cwire.encode_delivered(stream, messages, SCHEMES)
    assert compiled is not None
    assert compiled == _python(stream, messages)


def _plain(**changes: Any) -> ImmutableMessage:
    fields: dict[str, Any] = {
        "message_id": FileMessageId(7),
        "timetick": 5,
        "vchannel": "v",
        "type": MessageType.INSERT,
        "payload": b"x",
        "properties": {},
        "last_confirmed_id": FileMessageId(3),
        "txn": None,
        "idempotency_key": None,
        "term": 1,
    }
    fields.update(changes)
    return ImmutableMessage(**fields)


@pytest.mark.parametrize(
    "declined",
    [
        _plain(message_id=PulsarMessageId(1, 2, -1)),  # not a sequence id
        _plain(last_confirmed_id=PulsarMessageId(1, 2, -1)),
        _plain(timetick=2**64),  # beyond msgpack's 64 bits: msgspec raises
        _plain(term=-(2**63) - 1),
        _plain(properties={"k": 1}),  # not a map of str
        _plain(properties=types.MappingProxyType({1: "v"})),
        _plain(body=[_plain()]),  # a list, not the tuple the log gives
        _plain(vchannel="\ud800"),  # a lone surrogate: no UTF-8 for it
        _plain(payload=bytearray(b"x")),
    ],
)
def test_what_the_compiled_path_declines_goes_the_python_way(declined: ImmutableMessage) -> None:
    """The compiled walk declines (None) what it does not take; ``encode_delivered``
    then gives what the Python path gives, or raises what it raises."""
    batch = [_plain(), declined]
    assert _wire._cwire.encode_delivered(1, batch, SCHEMES) is None
    try:
        expected: bytes | type[Exception] = _python(1, batch)
    except Exception as exc:
        expected = type(exc)
    if isinstance(expected, bytes):
        assert _wire.encode_delivered(1, batch) == expected
    else:
        with pytest.raises(expected):
            _wire.encode_delivered(1, batch)


def test_an_id_class_is_learned_at_its_first_batch() -> None:
    """``encode_delivered`` teaches the compiled path each sequence id class as it
    meets it (a class that marshals otherwise stays on the Python path)."""
    messages = [_plain(message_id=MemoryMessageId(9), last_confirmed_id=MemoryMessageId(8))]
    _wire._schemes.pop(MemoryMessageId, None)
    assert _wire._cwire.encode_delivered(2, messages, _wire._schemes) is None
    assert _wire.encode_delivered(2, messages) == _python(2, messages)
    assert _wire._schemes[MemoryMessageId] == b"memory:"
    assert _wire._cwire.encode_delivered(2, messages, _wire._schemes) == _python(2, messages)


def test_the_client_decodes_the_compiled_bytes() -> None:
    messages = [_plain(properties={"a": "b"}, txn=TxnContext(4, 5), body=(_plain(),))]
    compiled = _wire._cwire.encode_delivered(3, messages, SCHEMES)
    assert compiled is not None
    (delivered,) = _decode(array_header(1) + compiled)
    assert delivered == Delivered(3, [_wire.wire_delivered(messages[0])])
