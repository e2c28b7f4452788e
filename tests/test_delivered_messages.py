"""The compiled client's messages of a ``Delivered`` (``_cclient.delivered_of``, used by
``RemoteWAL._messages``) against ``RemoteWAL._message`` of each: equal messages, field
for field, and the last-confirmed cache moved as the Python path moves it; or None,
building nothing and moving nothing, for what it leaves to Python (a transaction's
message, a type it does not know, an id it does not parse)."""

from __future__ import annotations

from typing import Any

from _envelope_strategies import TEXT, U64
from hypothesis import example, given
from hypothesis import strategies as st

from walsvc import CorruptRecord, MessageType
from walsvc.remote import _client
from walsvc.remote._client import RemoteWAL, _Ids
from walsvc.remote._node_messages import WireDelivered

IDS = st.one_of(
    st.builds("memory:{}".format, U64),
    st.builds("file:{}".format, st.integers(0, 99)),
    st.sampled_from(["memory:", "memory:x1", "memory:" + "9" * 25, "nope:3", "memory:007"]),
)
TYPES = st.one_of(
    st.sampled_from([int(t) for t in MessageType]), st.integers(10_000, 10_003), st.just(7777)
)
WIRES = st.builds(
    WireDelivered,
    message_id=IDS,
    timetick=U64,
    vchannel=TEXT,
    type=TYPES,
    payload=st.binary(max_size=40),
    properties=st.one_of(st.just({}), st.dictionaries(TEXT, TEXT, max_size=2)),
    last_confirmed_id=st.one_of(st.none(), st.sampled_from(["memory:4", "memory:5"]), IDS),
    txn=st.one_of(st.none(), st.none(), st.just((3, 1000))),
    idempotency_key=st.one_of(st.none(), TEXT),
    term=U64,
    persisted=st.booleans(),
    durable_tick=U64,
    body=st.just([]),
)


class _Parsers:
    """What ``RemoteWAL._message`` reads of its WAL: the id parsers (fresh, each scheme
    learnt as a WAL learns it from the first id it parses)."""

    _message = RemoteWAL._message
    _messages = RemoteWAL._messages

    def __init__(self) -> None:
        self._sequences: dict[str, Any] = {}
        self._ids = _Ids(self._sequences)
        self._lc_ids = _Ids(self._sequences)
        for text in ("memory:0", "file:0"):
            self._ids(text)


def _python(wires: list[WireDelivered]) -> Any:
    parsers = _Parsers()
    try:
        return [parsers._message(w) for w in wires], parsers._lc_ids._last_text
    except CorruptRecord as exc:
        return f"CorruptRecord: {exc}"


def test_the_compiled_deliveries_are_bound() -> None:
    assert _client.compiled_deliveries


@given(st.lists(WIRES, max_size=12))
@example([WireDelivered("memory:1", 2, "v", 1, b"p", {}, "memory:4", None, "k", 3, True, 4, [])])
def test_the_compiled_messages_are_the_python_messages(wires: list[WireDelivered]) -> None:
    parsers = _Parsers()
    before = parsers._lc_ids._last_text
    made = _client._cclient.delivered_of(wires, parsers._sequences, parsers._lc_ids)
    if made is None:
        assert parsers._lc_ids._last_text == before  # nothing moved
        return
    assert (made, parsers._lc_ids._last_text) == _python(wires)
    assert all(type(m.type) is MessageType for m in made)


def test_a_delivery_of_plain_and_keyed_messages_is_made_whole_by_the_compiled_loop() -> None:
    wires = [
        WireDelivered(f"file:{i}", 10 + i, "v", 1, b"p", {}, "file:3", None, key, 7, True, 9, [])
        for i, key in enumerate([None, "~p.1", None])
    ]
    parsers = _Parsers()
    assert parsers._messages(wires) == _python(wires)[0]
    made = _client._cclient.delivered_of(wires, parsers._sequences, parsers._lc_ids)
    assert made is not None
    assert [m.message_id.seq for m in made] == [0, 1, 2]


def test_a_transaction_message_is_left_to_python() -> None:
    wire = WireDelivered("file:1", 2, "v", 1, b"p", {}, None, (3, 1000), None, 7, True, 9, [])
    parsers = _Parsers()
    assert _client._cclient.delivered_of([wire], parsers._sequences, parsers._lc_ids) is None
    assert parsers._messages([wire]) == _python([wire])[0]
