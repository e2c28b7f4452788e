"""The client's compiled append path (``walsvc/remote/_cclient.c``) writes, byte for
byte, the ``Append``/``AppendMany`` requests the Python path (``_check_user_message``,
``_ProducerKeys``, ``_wire`` and msgspec) writes, producer keys included, and turns the
node's answers into the ``AppendResult``s ``RemoteWAL._result`` makes. What it does not
take it declines (None), and the Python path then encodes it or raises what it raises.
A request queued as its bytes is resent after a reconnect with the same producer keys."""

from __future__ import annotations

import asyncio
import itertools
import types
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import pytest
from _chain_support import whole_log
from _tcp_proxy import TcpProxy
from hypothesis import example, given
from hypothesis import strategies as st

import walsvc
from walsvc import Message, MessageType
from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._kafka._ids import KafkaMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.backends._pulsar._ids import PulsarMessageId
from walsvc.core._errors import CorruptRecord
from walsvc.core._message import SYSTEM_TYPES, AppendResult, TxnContext
from walsvc.remote import _client, _connection
from walsvc.remote._frames import FrameWriter
from walsvc.remote._pending import Pending, PendingRequests
from walsvc.remote._protocol import (
    PRODUCER_KEY_PREFIX,
    Append,
    Appended,
    AppendMany,
    ClientMessage,
    Opened,
    WireResult,
)

_cclient = _client._cclient
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ClientMessage).decode

# Lengths where msgpack changes format (fix, 8-, 16- and 32-bit lengths).
_EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]
_INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_POSITIVE_EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63]
_NEGATIVE_EDGES = [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
_INTS = _INT64 | st.sampled_from([*_POSITIVE_EDGES, 2**64 - 1, *_NEGATIVE_EDGES])


def _sized(n: int, fill: str = "x") -> str:
    """A str of ``n`` UTF-8 bytes, two-byte characters where it can."""
    return "é" * (n // 2) + fill * (n % 2)


_TEXT = st.text(max_size=40) | st.sampled_from(_EDGES).map(_sized)
# A vchannel is at most 65535 UTF-8 bytes.
_VCHANNELS = st.text(max_size=40) | st.sampled_from(_EDGES[:-1]).map(_sized)
_USER_TYPES = [t for t in MessageType if t not in SYSTEM_TYPES]
_TYPES = (
    st.sampled_from(_USER_TYPES)
    | st.sampled_from([10_000, 10_001, 32_767, 32_768, 65_535]).map(MessageType)
    | st.integers(min_value=10_000, max_value=65_535).map(MessageType)
)
# User keys: any text but the producer keys' prefix, at every str length edge.
_USER_KEYS = (_TEXT | st.sampled_from(_EDGES).map(lambda n: _sized(n, "k"))).filter(
    lambda key: not key.startswith(PRODUCER_KEY_PREFIX)
)
# Producer key prefixes: the real one's shape, and lengths that put prefix + hex digits
# on both sides of msgpack's str edges (31/32, 255/256).
_PREFIXES = (
    st.just(_client._ProducerKeys(_client._new_producer())._prefix)
    | st.text(max_size=40).map(lambda t: f"{PRODUCER_KEY_PREFIX}{t}.")
    | st.sampled_from([14, 15, 16, 28, 29, 30, 31, 240, 250, 254, 255]).map(lambda n: "~" * n)
)
# Counters whose next numbers cross a hex digit count (0xf -> 0x10, ...).
_COUNTERS = st.integers(min_value=0, max_value=2**64 - 100) | st.sampled_from(
    [0, 14, 15, 16, 254, 255, 4094, 4095, 2**32 - 2, 2**32 - 1, 2**60 - 1, 2**64 - 100]
)


def _properties() -> st.SearchStrategy[Any]:
    plain = st.dictionaries(_TEXT, _TEXT, max_size=18)
    return plain | plain.map(types.MappingProxyType)


MESSAGES = st.builds(
    Message,
    payload=st.binary(max_size=64) | st.sampled_from(_EDGES).map(lambda n: b"p" * n),
    vchannel=_VCHANNELS,
    type=_TYPES,
    properties=_properties(),
    idempotency_key=st.none() | _USER_KEYS,
)


def _python(
    request: int, wal: int, messages: list[Any], prefix: str, next_key: int, *, many: bool = True
) -> tuple[bytes, int]:
    """What the Python path sends (or raises), and its producer key counter after."""
    keys = _client._ProducerKeys(_client._new_producer())
    keys._prefix, keys._next = prefix, next_key
    for message in messages:
        _client._check_user_message(message)
    wires = [_client._wire(m, keys(m)) for m in messages]
    item = AppendMany(request, wal, wires) if many else Append(request, wal, wires[0])
    return _encode(item), keys._next


def test_the_compiled_client_is_built() -> None:
    """``make test`` builds walsvc/remote/_cclient.c; without it a client spends about
    twice the CPU per appended message."""
    assert _client.compiled


@given(_INTS, _INTS, st.lists(MESSAGES, min_size=1, max_size=20), _PREFIXES, _COUNTERS)
@example(1, 1, [Message(payload=b"", vchannel="")], "~", 2**64 - 2)  # key "~ffffffffffffffff"
def test_the_compiled_append_many_bytes_are_the_python_bytes(
    request: int, wal: int, messages: list[Message], prefix: str, next_key: int
) -> None:
    compiled = _cclient.encode_append_many(request, wal, messages, prefix, next_key)
    assert compiled is not None
    assert compiled == _python(request, wal, messages, prefix, next_key)


@given(_INTS, _INTS, MESSAGES, _PREFIXES, _COUNTERS)
def test_the_compiled_append_bytes_are_the_python_bytes(
    request: int, wal: int, message: Message, prefix: str, next_key: int
) -> None:
    compiled = _cclient.encode_append(request, wal, message, prefix, next_key)
    assert compiled is not None
    assert compiled == _python(request, wal, [message], prefix, next_key, many=False)


@pytest.mark.parametrize("count", [15, 16, 65535, 65536])
def test_batches_at_the_array_length_edges(count: int) -> None:
    messages = [Message(payload=b"%d" % i, vchannel="v") for i in range(count)]
    compiled = _cclient.encode_append_many(3, 4, messages, "~edge.", 0)
    assert compiled == _python(3, 4, messages, "~edge.", 0)
    assert compiled is not None
    assert compiled[1] == count


def _plain(**changes: Any) -> Message:
    fields: dict[str, Any] = {"payload": b"x", "vchannel": "v"}
    fields.update(changes)
    return Message(**fields)


class _Sub(Message, kw_only=True):
    """A subclass: the Python path takes it (isinstance), the compiled one declines."""


class _Properties(Mapping[str, str]):
    def __init__(self, items: dict[str, str]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class _Failing(_Properties):
    """Fails once ``armed`` (after the message checked it)."""

    def __init__(self) -> None:
        super().__init__({"a": "b"})
        self.armed = False

    def __getitem__(self, key: str) -> str:
        if self.armed:
            raise LookupError(f"no {key!r} today")
        return super().__getitem__(key)


def _failing() -> Message:
    properties = _Failing()
    message = _plain(properties=types.MappingProxyType(properties))
    properties.armed = True
    return message


def _mutated() -> Message:
    """A message whose properties dict was given a non-str value after it was built."""
    properties = {"k": "v"}
    message = _plain(properties=properties)
    properties["k"] = 1  # type: ignore[assignment]
    return message


_DECLINED = {
    "not a Message": {"payload": b"x", "vchannel": "v"},
    "an ImmutableMessage": walsvc.ImmutableMessage(
        MemoryMessageId(1), 1, "v", MessageType.INSERT, b"x", {}, None, None, None, 1
    ),
    "a subclass": _Sub(payload=b"x", vchannel="v"),
    "a TimeTick": _plain(type=MessageType.TIME_TICK),
    "a BeginTxn": _plain(type=MessageType.BEGIN_TXN),
    "a Txn": _plain(type=MessageType.TXN),
    "a txn": _plain(txn=TxnContext(1, 1000)),
    "a reserved key": _plain(idempotency_key=PRODUCER_KEY_PREFIX + "mine"),
    "the bare prefix": _plain(idempotency_key=PRODUCER_KEY_PREFIX),
    "a non-str property": _mutated(),
    "a non-dict mapping": _plain(properties=_Properties({"a": "b"})),
    "a proxy of a failing mapping": _failing(),
}


def _outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:
        return (type(exc), str(exc))


@pytest.mark.parametrize("name", list(_DECLINED))
def test_what_the_compiled_encoding_declines_goes_the_python_way(name: str) -> None:
    """The compiled path declines (None) what it does not take; the Python path then
    encodes it (a subclass, properties that are another mapping) or raises its error."""
    declined = _DECLINED[name]
    batch = [_plain(), declined, _plain()]
    assert _cclient.encode_append_many(1, 7, batch, "~p.", 5) is None
    assert _cclient.encode_append(1, 7, declined, "~p.", 5) is None
    for python, wal in (
        (lambda: _python(1, 7, batch, "~p.", 5), lambda: _wal_append_many(batch)),
        (lambda: _python(1, 7, [declined], "~p.", 5, many=False), lambda: _wal_append(declined)),
    ):
        expected = _outcome(python)
        if isinstance(expected[0], bytes):  # what a RemoteWAL (request 1, handle 7) sends
            expected = ([(expected[0], True)], expected[1])
        assert _outcome(lambda: _sent(_run(wal()))) == expected  # noqa: B023 (called at once)


def _sent(answered: _Answered) -> tuple[list[tuple[bytes, bool]], int]:
    return answered.sent, answered.next_key


def test_a_mappingproxy_of_another_mapping_is_copied_as_dict_copies_it() -> None:
    message = _plain(properties=types.MappingProxyType(_Properties({"b": "1", "a": "2"})))
    assert _cclient.encode_append(1, 2, message, "~p.", 0) == _python(
        1, 2, [message], "~p.", 0, many=False
    )


@pytest.mark.parametrize(
    ("request_id", "wal", "next_key", "python"),
    [
        (2**64, 1, 0, OverflowError),  # beyond msgpack's 64 bits: msgspec raises
        (-(2**63) - 1, 1, 0, OverflowError),
        (1, 2**64, 0, OverflowError),
        (1, 1, 2**64 - 1, "~p.10000000000000000"),  # a key number of 65 bits
        (1, 1, -1, "~p.0"),
    ],
)
def test_numbers_out_of_range_are_declined(
    request_id: int, wal: int, next_key: int, python: type[Exception] | str
) -> None:
    """Declined; the Python path then raises msgspec's error, or makes the key."""
    messages = [_plain()]
    assert _cclient.encode_append_many(request_id, wal, messages, "~p.", next_key) is None
    assert _cclient.encode_append(request_id, wal, messages[0], "~p.", next_key) is None
    if isinstance(python, str):
        data, _ = _python(request_id, wal, messages, "~p.", next_key)
        assert _decode(data).messages[0].idempotency_key == python
    else:
        with pytest.raises(python):
            _python(request_id, wal, messages, "~p.", next_key)


def test_an_empty_batch_is_declined() -> None:
    """``append_many([])`` sends nothing (the Python path returns [])."""
    assert _cclient.encode_append_many(1, 1, [], "~p.", 0) is None
    assert _run(_wal_append_many([])) == _Answered([], [], 5)


def test_a_user_key_needs_no_number() -> None:
    """A user key takes no number: the counter at its 64-bit end still encodes it."""
    keyed = _plain(idempotency_key="user")
    assert _cclient.encode_append(1, 1, keyed, "~p.", 2**64 - 1) == _python(
        1, 1, [keyed], "~p.", 2**64 - 1, many=False
    )


# -- results ---------------------------------------------------------------------------

_SEQUENCES: dict[str, type[Any]] = {
    "file": FileMessageId,
    "memory": MemoryMessageId,
    "kafka": KafkaMessageId,
}
# Up to 19 digits (more: the Python path parses them).
_POSITIONS = st.integers(min_value=0, max_value=10**19 - 1) | st.sampled_from(
    [0, 9, 10, 2**31, 2**62, 2**63 - 1, 2**63, 10**18, 10**19 - 1]
)


def _wire_results() -> st.SearchStrategy[list[WireResult]]:
    scheme = st.sampled_from(list(_SEQUENCES))
    lcs = st.none() | st.sampled_from(["{s}:0", "{s}:7", "{s}:9223372036854775807"])

    def results(s: str) -> st.SearchStrategy[list[WireResult]]:
        return st.lists(
            st.builds(
                lambda position, tick, lc: WireResult(
                    f"{s}:{position}", tick, None if lc is None else lc.format(s=s)
                ),
                _POSITIONS,
                _INT64,
                lcs,
            ),
            max_size=20,
        )

    return scheme.flatmap(results)


def _parsers(seed: str | None = None) -> tuple[_client._Ids, _client._Ids]:
    """An id parser and a last-confirmed id parser that know the sequence schemes (and
    have parsed ``seed`` last)."""
    ids = _client._Ids(dict(_SEQUENCES))
    lc_ids = _client._Ids(ids.sequences)
    if seed is not None:
        lc_ids(seed)
    return ids, lc_ids


def _python_results(
    wires: list[WireResult], ids: _client._Ids, lc_ids: _client._Ids
) -> list[AppendResult]:
    """``RemoteWAL._result`` of each, with these parsers."""
    return [
        AppendResult(
            ids(w.message_id),
            w.timetick,
            None if w.last_confirmed_id is None else lc_ids(w.last_confirmed_id),
        )
        for w in wires
    ]


def _shared(results: list[AppendResult]) -> list[bool]:
    """Which results share their last-confirmed id object with the one before."""
    return [
        a.last_confirmed_id is not None and a.last_confirmed_id is b.last_confirmed_id
        for a, b in itertools.pairwise(results)
    ]


@given(_wire_results(), st.sampled_from([None, "memory:7", "file:0", "kafka:5"]))
def test_the_compiled_results_are_the_python_results(
    wires: list[WireResult], seed: str | None
) -> None:
    ids, lc_ids = _parsers(seed)
    seeded = lc_ids._last
    compiled = _cclient.results_of(wires, ids.sequences, lc_ids)
    python_ids, python_lc_ids = _parsers(seed)
    python_seeded = python_lc_ids._last
    expected = _python_results(wires, python_ids, python_lc_ids)
    assert compiled == expected
    assert [type(r.message_id) for r in compiled] == [type(r.message_id) for r in expected]
    # the same objects shared as _Ids shares them, and the same cache left behind
    assert _shared(compiled) == _shared(expected)
    assert [r.last_confirmed_id is seeded for r in compiled] == [
        r.last_confirmed_id is python_seeded for r in expected
    ]
    assert (lc_ids._last_text, lc_ids._last) == (python_lc_ids._last_text, python_lc_ids._last)


def test_a_repeated_last_confirmed_id_is_one_object_across_calls() -> None:
    ids, lc_ids = _parsers("file:3")
    seeded = lc_ids._last
    first = _cclient.results_of(
        [WireResult("file:5", 1, "file:3"), WireResult("file:6", 2, "file:3")],
        ids.sequences,
        lc_ids,
    )
    assert first is not None
    assert first[0].last_confirmed_id is seeded
    assert first[1].last_confirmed_id is seeded
    moved = _cclient.results_of([WireResult("file:7", 3, "file:6")], ids.sequences, lc_ids)
    assert moved is not None
    assert lc_ids._last is moved[0].last_confirmed_id
    assert lc_ids._last_text == "file:6"
    again = _cclient.results_of([WireResult("file:8", 4, "file:6")], ids.sequences, lc_ids)
    assert again is not None
    assert again[0].last_confirmed_id is moved[0].last_confirmed_id
    assert [r.last_confirmed_id for r in (*first, *moved)] == [
        FileMessageId(3),
        FileMessageId(3),
        FileMessageId(6),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "pulsar:1:2:-1:-1",  # not a sequence id: the Python path parses it
        "nosuch:5",  # a scheme not in the classes
        "memory:12a",
        "memory:",
        "memory:-1",
        "memory:+1",
        "memory: 1",
        "memory:1_0",
        "memory:\u0663",  # an Arabic-Indic digit: isdigit, not ASCII
        "memory:\u00b2",
        "memory5",
        ":5",
        "memory:12345678901234567890",  # 20 digits: Python takes the longer number
    ],
)
@pytest.mark.parametrize("where", ["message_id", "last_confirmed_id"])
def test_what_results_of_declines_goes_the_python_way(text: str, where: str) -> None:
    """Declined (None), the Python ``_result`` raises ``CorruptRecord`` for a bad
    position, ``UnknownBackend`` for an unknown scheme, or parses what it can."""
    good = WireResult("memory:1", 1, "memory:0")
    bad = msgspec.structs.replace(good, **{where: text})
    ids, lc_ids = _parsers()
    assert _cclient.results_of([good, bad], ids.sequences, lc_ids) is None
    assert lc_ids._last is None  # the cache moves only with results it gave
    expected = _outcome(lambda: _python_results([good, bad], *_parsers()))
    if text.startswith("memory") and not text.startswith("memory:1234"):
        assert isinstance(expected, tuple)
        assert expected[0] is CorruptRecord
    batch = [_plain(), _plain()]
    assert _outcome(lambda: _run(_wal_append_many(batch, answer=[good, bad])).results) == expected


def test_ids_of_classes_with_their_own_parsing_are_not_learned() -> None:
    """The Python parser teaches the compiled path the sequence classes only."""
    ids, _ = _parsers()
    ids.sequences.clear()
    ids("memory:4")
    ids(PulsarMessageId(1, 2, -1).marshal())
    assert ids.sequences == {"memory": MemoryMessageId}


# -- the WAL's two paths, with a connection that answers at once -----------------------


class _Connection:
    """Stands in for ``Connection``: records each request (its bytes and resend flag)
    and answers it at once, with ``answer`` or memory ids counting up. Every request
    id is 1: a call the compiled path declined takes another id on its Python path,
    and the requests of the two paths are compared byte for byte."""

    def __init__(self, answer: list[WireResult] | None) -> None:
        self.sent: list[tuple[bytes, bool]] = []
        self.full = False
        self.waited = False
        self._answer = answer
        self._positions = itertools.count(100)

    def on_reconnect(self, reopen: Any) -> None:
        pass

    def saw_tick(self, timetick: int) -> None:
        pass

    async def room(self) -> None:
        self.waited = True
        self.full = False

    def next_id(self) -> int:
        return 1

    def request(self, item: Any, request: int, *, append: bool, resend: bool) -> Pending:
        data = item if type(item) is bytes else _encode(item)
        self.sent.append((data, resend))
        fields = msgspec.msgpack.decode(data)  # untyped: properties may not be str
        count = len(fields[3]) if fields[0] == AppendMany.__struct_config__.tag else 1
        answer = self._answer or [
            WireResult(f"memory:{next(self._positions)}", 1000 + i, "memory:99")
            for i in range(count)
        ]
        future = asyncio.get_running_loop().create_future()
        future.set_result(Appended(request, answer))
        return Pending(future, item, append, resend)


class _Answered(msgspec.Struct, frozen=True):
    results: list[AppendResult]
    sent: list[tuple[bytes, bool]]
    next_key: int


def _wal(conn: _Connection) -> _client.RemoteWAL:
    wal = _client.RemoteWAL(
        conn,  # type: ignore[arg-type]
        Opened(1, 7, 1, False, "memory"),
        "p",
        (16, 1 << 20),
    )
    assert wal._keys is not None
    wal._keys._prefix = "~p."
    wal._keys._next = 5
    return wal


async def _wal_append_many(
    batch: list[Any],
    *,
    compiled: bool = True,
    answer: list[WireResult] | None = None,
    full: bool = False,
) -> _Answered:
    conn = _Connection(answer)
    conn.full = full
    wal = _wal(conn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_client, "compiled", compiled)
        results = await wal.append_many(batch)
    assert wal._keys is not None
    return _Answered(results, conn.sent, wal._keys._next)


async def _wal_append(message: Any, *, compiled: bool = True, full: bool = False) -> _Answered:
    conn = _Connection(None)
    conn.full = full
    wal = _wal(conn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_client, "compiled", compiled)
        result = await wal.append(message)
    assert wal._keys is not None
    return _Answered([result], conn.sent, wal._keys._next)


def _run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


_SOME_DECLINED = st.sampled_from(list(_DECLINED.values()))


@given(st.lists(MESSAGES | _SOME_DECLINED, max_size=8), st.booleans())
def test_append_many_gives_what_the_python_path_gives(batch: list[Any], full: bool) -> None:
    """``RemoteWAL.append_many`` compiled and in Python, with room or after waiting for
    it: the same request (bytes, resend flag), producer key counter, results, or error."""
    compiled = _outcome(lambda: _run(_wal_append_many(batch, compiled=True, full=full)))
    python = _outcome(lambda: _run(_wal_append_many(batch, compiled=False, full=full)))
    assert compiled == python


@given(MESSAGES | _SOME_DECLINED, st.booleans())
def test_append_gives_what_the_python_path_gives(message: Any, full: bool) -> None:
    compiled = _outcome(lambda: _run(_wal_append(message, compiled=True, full=full)))
    python = _outcome(lambda: _run(_wal_append(message, compiled=False, full=full)))
    assert compiled == python


@pytest.mark.parametrize("compiled", [True, False])
async def test_a_refused_message_is_refused_before_waiting_for_room(compiled: bool) -> None:
    conn = _Connection(None)
    conn.full = True
    wal = _wal(conn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_client, "compiled", compiled)
        with pytest.raises(walsvc.InvalidMessage):
            await wal.append(_DECLINED["a TimeTick"])
        with pytest.raises(walsvc.InvalidMessage):
            await wal.append_many([_plain(), _DECLINED["a txn"]])
        assert not conn.waited
        assert await wal.append_many([]) == []
        assert not conn.waited
        await wal.append_many([_plain()])
        assert conn.waited
    assert len(conn.sent) == 1


# -- resending ---------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, item: bytes, on_sent: Any = None) -> None:
        self.sent.append(item)


class _Socket:
    def __init__(self) -> None:
        self.version = 2
        self.writer = _Writer()


async def test_a_request_queued_as_bytes_is_resent_naming_the_new_handle() -> None:
    batch = [_plain(), _plain(idempotency_key="user"), _plain()]
    encoded = _cclient.encode_append_many(41, 3, batch, "~p.", 9)
    assert encoded is not None
    book = PendingRequests()
    book._add(41, Pending(asyncio.get_running_loop().create_future(), encoded[0], True, True))
    socket = _Socket()
    book._resend(socket, 8, "here")  # type: ignore[arg-type]
    # what the Python path sends again: the same keys, the new handle
    assert socket.writer.sent == [_python(41, 8, batch, "~p.", 9)[0]]


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def _landed(node: str, pchannel: str) -> list[walsvc.ImmutableMessage]:
    """The messages ``pchannel`` stores but TimeTicks, read straight from the node."""
    return [m for m in await whole_log(node, pchannel) if m.type is not MessageType.TIME_TICK]


async def test_a_compiled_append_is_resent_after_a_reconnect_with_its_producer_keys(
    node: str, proxy: tuple[TcpProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node takes the appends, their answers are lost with the connection: the
    client resends the bytes it encoded, decoded to name the WAL's new handle, with the
    same producer keys, and each message lands once. Over protocol version 2: over 3 the
    client asks the node first (``Recall``), which answers these from its window, and
    nothing is resent (tests/test_remote_recall.py)."""
    tcp, url = proxy
    sent: list[bytes] = []
    queued: list[type] = []
    send, request = FrameWriter.send, _connection.Connection.request

    def recording_send(writer: FrameWriter, item: bytes, on_sent: Any = None) -> None:
        sent.append(item)
        send(writer, item, on_sent)

    def recording_request(conn: _connection.Connection, item: Any, *args: Any, **kw: Any) -> Any:
        queued.append(type(item))
        return request(conn, item, *args, **kw)

    monkeypatch.setattr(FrameWriter, "send", recording_send)
    monkeypatch.setattr(_connection.Connection, "request", recording_request)
    pchannel = _pchannel()
    batch = [Message(payload=b"m%d" % i, vchannel="v") for i in range(5)]
    batch.append(Message(payload=b"keyed", vchannel="v", idempotency_key="user-key"))
    async with await walsvc.open_wal(url, pchannel, versions=(1, 2)) as wal:
        tcp.hold("down")  # the node gets the appends; their answers wait in the proxy
        many = asyncio.ensure_future(wal.append_many(batch))
        one = asyncio.ensure_future(wal.append(Message(payload=b"one", vchannel="v")))
        async with asyncio.timeout(10):  # until they landed on the node
            while len(await _landed(node, pchannel)) < 7:  # noqa: ASYNC110 (another process)
                await asyncio.sleep(0.02)
        assert not many.done()
        assert not one.done()
        assert tcp.cut() == 1
        results = [*(await many), await one]
        assert wal.connection.reconnects == 1
    assert queued.count(bytes) == 2  # both went the compiled way
    requests = [item for item in map(_decode, sent) if isinstance(item, Append | AppendMany)]
    firsts = [item for item in requests if isinstance(item, AppendMany)]
    singles = [item for item in requests if isinstance(item, Append)]
    assert len(firsts) == 2
    assert len(singles) == 2
    for first, again in (firsts, singles):  # the same request, to the new handle
        assert again == msgspec.structs.replace(first, wal=again.wal)
        assert _encode(first) in sent
        assert _encode(again) in sent
    keys = [wire.idempotency_key for wire in firsts[0].messages]
    assert keys[-1] == "user-key"
    assert all(key is not None and key.startswith(PRODUCER_KEY_PREFIX) for key in keys[:-1])
    assert len(set(keys)) == len(keys)
    assert singles[0].message.idempotency_key not in keys
    log = await _landed(node, pchannel)
    assert sorted(m.payload for m in log) == sorted([*(m.payload for m in batch), b"one"])
    found = {m.payload: m.message_id for m in log}
    assert [r.message_id for r in results] == [found[m.payload] for m in batch] + [found[b"one"]]
