"""Conversions between the node's WAL types and the wire's, shared by the session
(``_server``) and the transaction table (``_txns``)."""

from __future__ import annotations

from typing import Final

from walsvc.core._message import AppendResult, Message, MessageType
from walsvc.remote._protocol import WireMessage, WireResult

__all__ = ("message_of", "wire_result")

_TYPES: Final = {int(t): t for t in MessageType}


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
