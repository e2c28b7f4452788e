"""Conversions between the node's WAL types and the wire's, shared by the appends
(``_appends``), the stream pump (``_pump``) and the transaction table (``_txns``), and
the one ``encode`` every module of the node sends with.

``encode_delivered`` is a stream's per-message work: compiled (``_cwire.c``) for the
messages of the backends whose ids are sequence numbers, with ``wire_delivered`` and
``encode`` as its fallback and its definition (the two give the same bytes)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from walsvc.core._ids import SequenceMessageId
from walsvc.core._message import AppendResult, ImmutableMessage, Message, MessageType, TxnContext
from walsvc.remote._protocol import (
    PRODUCER_KEY_PREFIX,
    Delivered,
    WireDelivered,
    WireMessage,
    WireResult,
)

try:
    from . import _cwire
except ImportError:  # built without a C compiler: the Python path below
    _cwire = None  # type: ignore[assignment]

__all__ = ("compiled", "encode", "encode_delivered", "message_of", "wire_delivered", "wire_result")

_TYPES: Final = {int(t): t for t in MessageType}

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


#: Whether ``encode_delivered`` runs compiled (False: walsvc was built without
#: ``_cwire.c``, or the message classes' fields are not the slots it reads).
compiled: Final = _cwire is not None and _cwire.bind(
    ImmutableMessage, TxnContext, SequenceMessageId, PRODUCER_KEY_PREFIX
)
#: The id classes the compiled path marshals, with their text prefix ("file:"): every
#: ``SequenceMessageId`` class met that marshals as it does.
_schemes: dict[type, bytes] = {}


def encode_delivered(stream: int, messages: list[ImmutableMessage]) -> bytes:
    """The frame item ``Delivered(stream, [wire_delivered(m) for m in messages])``, as
    ``encode`` makes it (raising what it raises)."""
    if compiled:
        data = _cwire.encode_delivered(stream, messages, _schemes)
        if data is None and messages and _learn_ids(messages[0]):
            data = _cwire.encode_delivered(stream, messages, _schemes)
        if data is not None:
            return data
    return encode(Delivered(stream, [wire_delivered(m) for m in messages]))


def _learn_ids(message: ImmutableMessage) -> bool:
    """Add the id classes of ``message`` (its id and last-confirmed id) that the
    compiled path can marshal to ``_schemes``; True if any was new."""
    learned = False
    for id_ in (message.message_id, message.last_confirmed_id):
        if not isinstance(id_, SequenceMessageId):
            continue
        cls = type(id_)
        if cls not in _schemes and cls.marshal is SequenceMessageId.marshal:
            _schemes[cls] = f"{cls.scheme}:".encode()
            learned = True
    return learned
