"""The client's compiled append path (``walsvc/remote/_cclient.c``) writes, byte for
byte, the ``Append``/``AppendMany`` requests the Python path (``_check_user_message``,
``_ProducerKeys``, ``_wire`` and msgspec) writes, producer keys included. What it does not
take it declines (None), and the Python path then encodes it or raises what it raises;
``RemoteWAL.append`` and ``append_many`` give the same on either path. A request queued
as its bytes is resent after a reconnect with the same producer keys. (How the node's
answers become ``AppendResult``s: ``test_append_answer_decoding``.)"""

from __future__ import annotations

import asyncio
import types
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import pytest
from _append_support import (
    INT64,
    Answered,
    InstantConnection,
    encode,
    outcome,
    remote_wal,
    run,
    wal_append,
    wal_append_many,
)
from _append_support import plain as _plain
from _chain_support import whole_log
from _tcp_proxy import TcpProxy
from hypothesis import example, given
from hypothesis import strategies as st

import walsvc
from walsvc import Message, MessageType
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._message import SYSTEM_TYPES, TxnContext
from walsvc.remote import _client, _connection
from walsvc.remote._frames import FrameWriter
from walsvc.remote._pending import Pending, PendingRequests
from walsvc.remote._protocol import PRODUCER_KEY_PREFIX, Append, AppendMany, ClientMessage

_cclient = _client._cclient
_decode = msgspec.msgpack.Decoder(ClientMessage).decode

# Lengths where msgpack changes format (fix, 8-, 16- and 32-bit lengths).
_EDGES = [0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]
_POSITIVE_EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63]
_NEGATIVE_EDGES = [-1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
_INTS = INT64 | st.sampled_from([*_POSITIVE_EDGES, 2**64 - 1, *_NEGATIVE_EDGES])


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
    return encode(item), keys._next


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


@pytest.mark.parametrize("name", list(_DECLINED))
def test_what_the_compiled_encoding_declines_goes_the_python_way(name: str) -> None:
    """The compiled path declines (None) what it does not take; the Python path then
    encodes it (a subclass, properties that are another mapping) or raises its error."""
    declined = _DECLINED[name]
    batch = [_plain(), declined, _plain()]
    assert _cclient.encode_append_many(1, 7, batch, "~p.", 5) is None
    assert _cclient.encode_append(1, 7, declined, "~p.", 5) is None
    for python, wal in (
        (lambda: _python(1, 7, batch, "~p.", 5), lambda: wal_append_many(batch)),
        (lambda: _python(1, 7, [declined], "~p.", 5, many=False), lambda: wal_append(declined)),
    ):
        expected = outcome(python)
        if isinstance(expected[0], bytes):  # what a RemoteWAL (request 1, handle 7) sends
            expected = ([(expected[0], True)], expected[1])
        assert outcome(lambda: _sent(run(wal()))) == expected  # noqa: B023 (called at once)


def _sent(answered: Answered) -> tuple[list[tuple[bytes, bool]], int]:
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
    assert run(wal_append_many([])) == Answered([], [], 5)


def test_a_user_key_needs_no_number() -> None:
    """A user key takes no number: the counter at its 64-bit end still encodes it."""
    keyed = _plain(idempotency_key="user")
    assert _cclient.encode_append(1, 1, keyed, "~p.", 2**64 - 1) == _python(
        1, 1, [keyed], "~p.", 2**64 - 1, many=False
    )


# -- the WAL's two paths, with a connection that answers at once -----------------------


_SOME_DECLINED = st.sampled_from(list(_DECLINED.values()))


@given(st.lists(MESSAGES | _SOME_DECLINED, max_size=8), st.booleans())
def test_append_many_gives_what_the_python_path_gives(batch: list[Any], full: bool) -> None:
    """``RemoteWAL.append_many`` compiled and in Python, with room or after waiting for
    it: the same request (bytes, resend flag), producer key counter, results, or error."""
    compiled = outcome(lambda: run(wal_append_many(batch, compiled=True, full=full)))
    python = outcome(lambda: run(wal_append_many(batch, compiled=False, full=full)))
    assert compiled == python


@given(MESSAGES | _SOME_DECLINED, st.booleans())
def test_append_gives_what_the_python_path_gives(message: Any, full: bool) -> None:
    compiled = outcome(lambda: run(wal_append(message, compiled=True, full=full)))
    python = outcome(lambda: run(wal_append(message, compiled=False, full=full)))
    assert compiled == python


@pytest.mark.parametrize("compiled", [True, False])
async def test_a_refused_message_is_refused_before_waiting_for_room(compiled: bool) -> None:
    conn = InstantConnection(None)
    conn.full = True
    wal = remote_wal(conn)
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
        assert encode(first) in sent
        assert encode(again) in sent
    keys = [wire.idempotency_key for wire in firsts[0].messages]
    assert keys[-1] == "user-key"
    assert all(key is not None and key.startswith(PRODUCER_KEY_PREFIX) for key in keys[:-1])
    assert len(set(keys)) == len(keys)
    assert singles[0].message.idempotency_key not in keys
    log = await _landed(node, pchannel)
    assert sorted(m.payload for m in log) == sorted([*(m.payload for m in batch), b"one"])
    found = {m.payload: m.message_id for m in log}
    assert [r.message_id for r in results] == [found[m.payload] for m in batch] + [found[b"one"]]
