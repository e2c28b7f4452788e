"""The envelope encoders (``walsvc.core._encode``): each compiled form writes byte for
byte what the Python form writes and declines exactly what it declines."""

from __future__ import annotations

from _envelope_strategies import MESSAGE_TYPES, PAYLOADS, TEXT, U64, in_python
from hypothesis import example, given
from hypothesis import strategies as st

import walsvc.core._compiled
from walsvc import Message, TxnContext
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._chain import (
    KEYED_BATCH,
    PARTLY_KEYED_BATCH,
    PLAIN_BATCH,
    UNCHECKED_BATCH,
    user_batch_kind,
)
from walsvc.core._encode import (
    are_keyed,
    are_plain,
    encode,
    encode_keyed_many,
    encode_plain,
    encode_plain_many,
    encode_plain_message,
    keyed_ext_prefix,
    last_confirmed_ext,
)
from walsvc.core._message import SYSTEM_TYPES


class _MessageSubclass(Message):
    """A user's subclass of Message: never taken for a plain batch."""


plain_messages = st.builds(Message, payload=PAYLOADS, vchannel=TEXT, type=MESSAGE_TYPES)
#: Read by slot (a Message) or by name (a subclass) in the compiled encoders.
plain_or_subclass = st.one_of(
    plain_messages,
    st.builds(_MessageSubclass, payload=PAYLOADS, vchannel=TEXT, type=MESSAGE_TYPES),
)


@given(
    st.lists(plain_messages, max_size=6),
    st.integers(0, 2**62),
    U64,
    st.binary(max_size=40),
    st.integers(0, 400_000),
)
def test_the_compiled_batch_encoder_writes_what_encode_plain_writes(
    messages: list[Message], first_tick: int, term: int, ext: bytes, limit: int
) -> None:
    """Byte for byte, and None (nothing encoded) exactly when one envelope passes the
    limit."""
    assert encode_plain_many(messages, first_tick, term, ext, limit) == in_python(
        encode_plain_many, messages, first_tick, term, ext, limit
    )


def _maybe_plain(cls: type[Message]) -> st.SearchStrategy[Message]:
    return st.builds(
        cls,
        payload=st.binary(max_size=12),
        vchannel=st.sampled_from(["v1", "", "ü"]),
        properties=st.sampled_from([{}, {"k": "v"}]),
        idempotency_key=st.sampled_from([None, "key"]),
        txn=st.sampled_from([None, TxnContext(1, 10)]),
    )


@given(
    st.lists(st.one_of(_maybe_plain(Message), _maybe_plain(_MessageSubclass)), max_size=5),
    st.integers(0, 14),
)
def test_the_compiled_plain_batch_check_agrees_with_the_python_one(
    messages: list[Message], max_payload: int
) -> None:
    """``are_plain``: every message a Message itself, with no properties, key or txn and
    a payload within ``max_payload``."""
    expected = all(
        type(m) is Message
        and not m.properties
        and m.idempotency_key is None
        and m.txn is None
        and len(m.payload) <= max_payload
        for m in messages
    )
    assert walsvc.core._compiled.are_plain is not None, "Message's fields were not bound"
    assert are_plain(messages, max_payload) is expected
    assert in_python(are_plain, messages, max_payload) is expected


@given(
    st.lists(
        st.one_of(
            _maybe_plain(Message),
            _maybe_plain(_MessageSubclass),
            st.builds(Message, payload=st.just(b""), vchannel=st.just("v"), type=MESSAGE_TYPES),
        ),
        max_size=5,
    )
)
def test_the_compiled_user_batch_kind_agrees_with_the_python_one(messages: list[Message]) -> None:
    """``user_batch_kind``: UNCHECKED_BATCH unless every message is a Message itself,
    without txn and of no system type; else PLAIN_BATCH (no key), KEYED_BATCH (every one
    keyed) or PARTLY_KEYED_BATCH."""
    user = all(
        type(m) is Message and m.txn is None and m.type not in SYSTEM_TYPES for m in messages
    )
    keyed = sum(m.idempotency_key is not None for m in messages)
    if not user:
        expected = UNCHECKED_BATCH
    elif keyed == 0:
        expected = PLAIN_BATCH
    else:
        expected = KEYED_BATCH if keyed == len(messages) else PARTLY_KEYED_BATCH
    assert walsvc.core._compiled.user_batch_kind is not None, "Message's fields were not bound"
    assert user_batch_kind(messages) == expected
    assert in_python(user_batch_kind, messages) == expected


#: Keys across every msgpack str form (fixstr < 32 bytes, str8, str16, str32), some not ASCII.
KEYS = st.one_of(
    st.none(),
    TEXT,
    st.builds(lambda c, n: c * n, st.sampled_from(["k", "é", "鍵"]), st.integers(0, 70_000)),
)
keyed_messages = st.builds(
    Message, payload=PAYLOADS, vchannel=TEXT, type=MESSAGE_TYPES, idempotency_key=KEYS
)


@given(
    st.lists(keyed_messages, max_size=6),
    st.integers(0, 2**62),
    U64,
    st.one_of(st.none(), st.integers(0, 2**63 - 1).map(MemoryMessageId)),
    st.integers(0, 400_000),
)
@example([Message(payload=b"p", vchannel="v", idempotency_key="k" * 31)], 1, 1, None, 10**6)
@example([Message(payload=b"p", vchannel="v", idempotency_key="k" * 32)], 1, 1, None, 10**6)
@example([Message(payload=b"p", vchannel="v", idempotency_key="k" * 256)], 1, 1, None, 10**6)
@example([Message(payload=b"p", vchannel="v", idempotency_key="k" * 65536)], 1, 1, None, 10**6)
def test_the_keyed_batch_encoder_writes_what_encode_writes(
    messages: list[Message],
    first_tick: int,
    term: int,
    last_confirmed: MemoryMessageId | None,
    limit: int,
) -> None:
    """Compiled and in Python: byte for byte the envelopes ``encode`` lays out with the
    same system fields, and None (nothing encoded) exactly when one passes the limit."""
    ext = b"" if last_confirmed is None else last_confirmed_ext(last_confirmed)
    prefix = keyed_ext_prefix(last_confirmed)
    expected: list[bytes] | None = [
        encode(m, timetick=tick, term=term, last_confirmed=last_confirmed)
        for tick, m in enumerate(messages, first_tick)
    ]
    assert expected is not None
    if any(len(record) > limit for record in expected):
        expected = None
    assert walsvc.core._compiled.encode_keyed_batch is not None
    assert encode_keyed_many(messages, first_tick, term, ext, prefix, limit) == expected
    assert in_python(encode_keyed_many, messages, first_tick, term, ext, prefix, limit) == expected


@given(
    st.lists(st.one_of(_maybe_plain(Message), _maybe_plain(_MessageSubclass)), max_size=5),
    st.integers(0, 14),
)
def test_the_compiled_keyed_batch_check_agrees_with_the_python_one(
    messages: list[Message], max_payload: int
) -> None:
    """``are_keyed``: every message a Message itself, with no properties or txn and a
    payload within ``max_payload`` (keys allowed)."""
    expected = all(
        type(m) is Message and not m.properties and m.txn is None and len(m.payload) <= max_payload
        for m in messages
    )
    assert walsvc.core._compiled.are_keyed is not None, "Message's fields were not bound"
    assert are_keyed(messages, max_payload) is expected
    assert in_python(are_keyed, messages, max_payload) is expected


@given(plain_or_subclass, st.integers(0, 2**62), U64, st.binary(max_size=40), st.integers(0, 4_000))
def test_the_compiled_single_encoder_writes_what_encode_plain_writes(
    message: Message, tick: int, term: int, ext: bytes, limit: int
) -> None:
    """Byte for byte, and None exactly when the envelope passes the limit."""
    record = encode_plain(message.type, message.vchannel, message.payload, tick, term, ext)
    expected = record if len(record) <= limit else None
    assert encode_plain_message(message, tick, term, ext, limit) == expected
    assert in_python(encode_plain_message, message, tick, term, ext, limit) == expected
