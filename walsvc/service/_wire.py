"""Conversions between the node's WAL types and the wire's, shared by the appends
(``_appends``), the stream pump (``_pump``) and the transaction table (``_txns``), and
the one ``encode`` every module of the node sends with.

``encode_delivered`` is a stream's per-message work, ``messages_of`` and
``encode_appended`` (``encode_appended_each`` for a group of single appends) an append's:
compiled (``_cwire.c``) for the messages and results of the backends whose ids are
sequence numbers, with ``wire_delivered``, ``message_of``, ``wire_result`` and ``encode``
as their fallback and their definition (the two paths give the same messages and the
same bytes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec

from walsvc.core._ids import SequenceMessageId
from walsvc.core._message import (
    _MAX_VCHANNEL_BYTES,
    APPLICATION_TYPES,
    AppendResult,
    ImmutableMessage,
    Message,
    MessageType,
    TxnContext,
)
from walsvc.remote._protocol import (
    PRODUCER_KEY_PREFIX,
    Appended,
    Delivered,
    WireDelivered,
    WireMessage,
    WireResult,
)
from walsvc.write._coalesce import Outcome

try:
    from . import _cwire
except ImportError:  # built without a C compiler: the Python path below
    _cwire = None  # type: ignore[assignment]

__all__ = (
    "charge_of",
    "compiled",
    "compiled_messages_of",
    "encode",
    "encode_appended",
    "encode_appended_each",
    "encode_delivered",
    "message_of",
    "messages_of",
    "wire_delivered",
    "wire_result",
)

#: The members of ``MessageType`` by number: the named ones, and each application type
#: met (``messages_of`` adds it: at most the 55,536 of ``APPLICATION_TYPES``, which
#: ``MessageType`` caches anyway).
_TYPES: Final[dict[int, MessageType]] = {int(t): t for t in MessageType}

#: A message of the protocol as the bytes of one item of a frame.
encode: Final = msgspec.msgpack.Encoder().encode


def wire_result(result: AppendResult) -> WireResult:
    """An append's result as it crosses the wire."""
    lc = result.last_confirmed_id
    return WireResult(
        result.message_id.marshal(), result.timetick, None if lc is None else lc.marshal()
    )


def message_of(wire: WireMessage) -> Message:
    """The message a client sent to append."""
    type_ = _TYPES.get(wire.type)
    return Message(
        payload=wire.payload,
        vchannel=wire.vchannel,
        type=wire.type if type_ is None else type_,  # type: ignore[arg-type]
        properties=wire.properties,
        idempotency_key=wire.idempotency_key,
    )


def wire_delivered(m: ImmutableMessage) -> WireDelivered:
    """A delivered message as it crosses the wire (the per-message work of every stream:
    kept to what must change: ids to text, a producer key dropped)."""
    lc = m.last_confirmed_id
    if lc is None:
        lc_text = None
    elif lc == _last_lc[0]:  # consecutive messages mostly share their last-confirmed id
        lc_text = _last_lc[1]
    else:
        lc_text = lc.marshal()
        _last_lc[:] = (lc, lc_text)
    txn = m.txn
    key = m.idempotency_key
    if key is not None and key.startswith(PRODUCER_KEY_PREFIX):
        key = None  # a client's producer key: the appender gave the message none
    properties = m.properties
    return WireDelivered(
        m.message_id.marshal(),
        m.timetick,
        m.vchannel,
        m.type,  # an IntEnum: msgpack encodes its value
        m.payload,
        properties if type(properties) is dict else dict(properties),
        lc_text,
        None if txn is None else (txn.txn_id, txn.keepalive_ms),
        key,
        m.term,
        m.persisted,
        m.durable_tick,
        [wire_delivered(inner) for inner in m.body] if m.body else [],
    )


#: The last last-confirmed id marshalled, and its text.
_last_lc: list[Any] = [None, None]


#: Whether ``encode_delivered``, ``encode_appended``, ``encode_appended_each`` and
#: ``messages_of`` run compiled (False: walsvc was built without ``_cwire.c``, or the
#: classes' fields are not the slots it reads).
compiled: Final = _cwire is not None and _cwire.bind(
    ImmutableMessage,
    TxnContext,
    SequenceMessageId,
    PRODUCER_KEY_PREFIX,
    AppendResult,
    Message,
    WireMessage,
    MessageType,
    _MAX_VCHANNEL_BYTES,
)
_T = TypeVar("_T")

#: The id classes the compiled path marshals, with their text prefix ("file:"): every
#: ``SequenceMessageId`` class met that marshals as it does.
_schemes: dict[type, bytes] = {}


def encode_delivered(stream: int, messages: list[ImmutableMessage]) -> bytes:
    """The frame item ``Delivered(stream, [wire_delivered(m) for m in messages])``, as
    ``encode`` makes it (raising what it raises)."""
    if compiled:
        first = messages[0] if messages else None
        data = _learning_ids(lambda: _cwire.encode_delivered(stream, messages, _schemes), first)
        if data is not None:
            return data
    return encode(Delivered(stream, [wire_delivered(m) for m in messages]))


def encode_appended(request: int, results: list[AppendResult]) -> bytes:
    """The frame item ``Appended(request, [wire_result(r) for r in results])``, as
    ``encode`` makes it (raising what it raises)."""
    if compiled:
        first = results[0] if results else None
        data = _learning_ids(lambda: _cwire.encode_appended(request, results, _schemes), first)
        if data is not None:
            return data
    return encode(Appended(request, [wire_result(r) for r in results]))


def encode_appended_each(requests: list[int], outcomes: list[Outcome]) -> list[bytes | None]:
    """For each of ``requests`` and its outcome (in order): the frame item
    ``Appended(request, [wire_result(outcome)])`` as ``encode`` makes it if the outcome
    is an ``AppendResult`` (exactly), else None (the request failed with that error)."""
    if compiled:
        answers = _learning_ids(
            lambda: _cwire.encode_appended_each(requests, outcomes, _schemes),
            lambda: next((o for o in outcomes if type(o) is AppendResult), None),
        )
        if answers is not None:
            return answers
    return [
        encode(Appended(request, [wire_result(outcome)])) if type(outcome) is AppendResult else None
        for request, outcome in zip(requests, outcomes, strict=True)
    ]


def charge_of(wires: list[WireMessage]) -> int:
    """What appending ``wires`` counts against a connection's requests in flight: 64
    bytes a message plus its payload (one C loop when compiled)."""
    if compiled and (charge := _cwire.charge_of(wires)) >= 0:
        return charge
    return sum([64 + len(wire.payload) for wire in wires])


def messages_of(wires: list[WireMessage]) -> list[Message]:
    """``[message_of(w) for w in wires]`` (raising what it raises)."""
    messages = compiled_messages_of(wires)
    return [message_of(w) for w in wires] if messages is None else messages


def compiled_messages_of(wires: list[WireMessage]) -> list[Message] | None:
    """``messages_of(wires)`` if the compiled path takes every one of them (then none
    is invalid), else None (nothing raised: the caller converts each with
    ``message_of``)."""
    if not compiled:
        return None
    messages = _cwire.messages_of(wires, _TYPES)
    if messages is None and _learn_types(wires):
        messages = _cwire.messages_of(wires, _TYPES)
    return messages


def _learn_types(wires: list[WireMessage]) -> bool:
    """Add the application types of ``wires`` missing from ``_TYPES``; True if any was
    new (the compiled path maps a type only through ``_TYPES``)."""
    learned = False
    for wire in wires:
        number = wire.type
        if type(number) is int and number in APPLICATION_TYPES and number not in _TYPES:
            _TYPES[number] = MessageType(number)
            learned = True
    return learned


def _learning_ids(
    compiled_call: Callable[[], _T | None],
    first: ImmutableMessage | AppendResult | Callable[[], AppendResult | None] | None,
) -> _T | None:
    """``compiled_call()``; if it declined (None), learn the id classes of ``first`` (the
    batch's first message or result, or a call that finds it: found only then) and, if
    one was new, call once more."""
    data = compiled_call()
    if data is None:
        if callable(first):
            first = first()
        if first is not None and _learn_ids(first):
            data = compiled_call()
    return data


def _learn_ids(item: ImmutableMessage | AppendResult) -> bool:
    """Add the id classes of ``item`` (its id and last-confirmed id) that the compiled
    path can marshal to ``_schemes``; True if any was new."""
    learned = False
    for id_ in (item.message_id, item.last_confirmed_id):
        if not isinstance(id_, SequenceMessageId):
            continue
        cls = type(id_)
        if cls not in _schemes and cls.marshal is SequenceMessageId.marshal:
            _schemes[cls] = f"{cls.scheme}:".encode()
            learned = True
    return learned
