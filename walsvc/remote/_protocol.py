"""walsvc wire protocol, versions 1 and 2: frames, message types, the handshake, error codes.

docs/protocol.md is the specification (byte layout, every field, the handshake, the
error table); this module is its executable form, shared by the client
(``walsvc.remote``) and the node (``walsvc.service``).

A frame is a 4-byte big-endian unsigned length N, then N bytes: one msgpack array whose
items are messages. Each message is a msgspec Struct encoded ``array_like`` with an
integer tag first (``[tag, field, ...]``), so a frame carries many requests, answers
or deliveries at once: a connection's writer drains everything queued into one frame.
Version 2 adds one node message, ``StreamStats`` (a stream's scanner stats), sent only on
connections that negotiated it.

The messages live by direction: ``_client_messages`` (client -> node, decoded by the node
as ``ClientMessage``) and ``_node_messages`` (node -> client, ``NodeMessage``). This
module holds what both sides share (versions, frame limits, error codes, the
producer-key prefix) and re-exports the messages, so either side imports the whole
protocol from here.
"""

from __future__ import annotations

import struct
from typing import Final

from walsvc.core._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    InvalidMessage,
    MessageTooLarge,
    RoutingMismatch,
    SubscriptionBusy,
    SubscriptionMismatch,
    TxnAborted,
    TxnBufferFull,
    TxnError,
    TxnExpired,
    TxnNotActive,
    Unauthenticated,
    UnknownBackend,
    UnknownTxn,
    UnsupportedVersion,
    WALClosed,
    WALError,
    WALFenced,
    WALReadOnly,
    WALTruncated,
)

from ._client_messages import (
    MAX_CREDIT,
    Ack,
    Append,
    AppendMany,
    ClientMessage,
    CloseStream,
    CloseWal,
    Credit,
    CreditAmount,
    DeleteSubscription,
    Flush,
    Hello,
    LatestId,
    OpenWal,
    Ping,
    Read,
    Recall,
    Status,
    Truncate,
    TxnAppend,
    TxnBegin,
    TxnCommit,
    TxnResume,
    TxnRollback,
    WireMessage,
)
from ._node_messages import (
    AckFailed,
    Appended,
    Delivered,
    Done,
    Failed,
    GoingAway,
    LatestIdIs,
    NodeMessage,
    Opened,
    Pong,
    Recalled,
    Refused,
    StatusIs,
    StreamEnded,
    StreamStarted,
    StreamStats,
    TxnBegun,
    Welcome,
    WireDelivered,
    WireResult,
)

__all__ = (
    "FRAME_HEADER",
    "MAX_CREDIT",
    "MAX_FRAME_BYTES",
    "NODE_VERSIONS",
    "PRODUCER_KEY_PREFIX",
    "RECALL_VERSION",
    "STREAM_STATS_VERSION",
    "Ack",
    "AckFailed",
    "Append",
    "AppendMany",
    "Appended",
    "ClientMessage",
    "CloseStream",
    "CloseWal",
    "Credit",
    "CreditAmount",
    "DeleteSubscription",
    "Delivered",
    "Done",
    "ErrorCode",
    "Failed",
    "Flush",
    "GoingAway",
    "Hello",
    "LatestId",
    "LatestIdIs",
    "NodeMessage",
    "OpenWal",
    "Opened",
    "Ping",
    "Pong",
    "Read",
    "Recall",
    "Recalled",
    "Refused",
    "Status",
    "StatusIs",
    "StreamEnded",
    "StreamStarted",
    "StreamStats",
    "Truncate",
    "TxnAppend",
    "TxnBegin",
    "TxnBegun",
    "TxnCommit",
    "TxnResume",
    "TxnRollback",
    "Welcome",
    "WireDelivered",
    "WireMessage",
    "WireResult",
    "array_header",
    "error_code",
    "error_from",
    "negotiate",
)

#: Idempotency keys that begin with this are producer keys: a client gives each message
#: appended without a key one (its producer id and a sequence number), so that a resend
#: after a lost connection lands once. The node drops them from what it delivers.
PRODUCER_KEY_PREFIX: Final = "~"
#: The protocol versions this code speaks, lowest and highest.
NODE_VERSIONS: Final = (1, 3)
#: The first version with ``StreamStats``: a node sends it only on a connection that
#: negotiated this version or a later one (an older client could not decode it).
STREAM_STATS_VERSION: Final = 2
#: The first version with ``Recall``: a reconnecting client asks it only of a node that
#: negotiated this version or a later one (an older node would drop the connection).
RECALL_VERSION: Final = 3
#: A frame's length prefix: 4 bytes, big-endian, unsigned; counts the body only.
FRAME_HEADER: Final = struct.Struct(">I")
#: The largest frame body either side accepts: 16 MiB of messages plus 64 KiB of
#: overhead. A longer prefix ends the connection (that peer's alone).
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024 + 64 * 1024


class ErrorCode:
    """The error codes of ``Refused``, ``Failed`` and ``StreamEnded`` (docs/protocol.md
    has the table); each but the protocol's own maps to one walsvc error class."""

    OK: Final = 0
    WAL_ERROR: Final = 1
    WAL_CLOSED: Final = 2
    WAL_FENCED: Final = 3
    WAL_READ_ONLY: Final = 4
    WAL_TRUNCATED: Final = 5
    CORRUPT_RECORD: Final = 6
    MESSAGE_TOO_LARGE: Final = 7
    INVALID_MESSAGE: Final = 8
    INVALID_ARGUMENT: Final = 9
    BACKEND_UNAVAILABLE: Final = 10
    APPEND_OUTCOME_UNKNOWN: Final = 11
    TXN_ERROR: Final = 12
    TXN_EXPIRED: Final = 13
    TXN_ABORTED: Final = 14
    TXN_NOT_ACTIVE: Final = 15
    UNKNOWN_TXN: Final = 16
    UNKNOWN_BACKEND: Final = 17
    TXN_BUFFER_FULL: Final = 18
    SUBSCRIPTION_BUSY: Final = 19
    SUBSCRIPTION_MISMATCH: Final = 20
    ROUTING_MISMATCH: Final = 21
    #: Handshake refusals.
    UNSUPPORTED_VERSION: Final = 100
    UNAUTHENTICATED: Final = 101
    PROTOCOL_ERROR: Final = 102


_CLASSES: Final[dict[int, type[WALError]]] = {
    ErrorCode.WAL_ERROR: WALError,
    ErrorCode.WAL_CLOSED: WALClosed,
    ErrorCode.WAL_FENCED: WALFenced,
    ErrorCode.WAL_READ_ONLY: WALReadOnly,
    ErrorCode.WAL_TRUNCATED: WALTruncated,
    ErrorCode.CORRUPT_RECORD: CorruptRecord,
    ErrorCode.MESSAGE_TOO_LARGE: MessageTooLarge,
    ErrorCode.INVALID_MESSAGE: InvalidMessage,
    ErrorCode.INVALID_ARGUMENT: InvalidArgument,
    ErrorCode.BACKEND_UNAVAILABLE: BackendUnavailable,
    ErrorCode.APPEND_OUTCOME_UNKNOWN: AppendOutcomeUnknown,
    ErrorCode.TXN_ERROR: TxnError,
    ErrorCode.TXN_EXPIRED: TxnExpired,
    ErrorCode.TXN_ABORTED: TxnAborted,
    ErrorCode.TXN_NOT_ACTIVE: TxnNotActive,
    ErrorCode.UNKNOWN_TXN: UnknownTxn,
    ErrorCode.UNKNOWN_BACKEND: UnknownBackend,
    ErrorCode.TXN_BUFFER_FULL: TxnBufferFull,
    ErrorCode.SUBSCRIPTION_BUSY: SubscriptionBusy,
    ErrorCode.SUBSCRIPTION_MISMATCH: SubscriptionMismatch,
    ErrorCode.ROUTING_MISMATCH: RoutingMismatch,
    ErrorCode.UNSUPPORTED_VERSION: UnsupportedVersion,
    ErrorCode.UNAUTHENTICATED: Unauthenticated,
}
_CODES: Final = {cls: code for code, cls in _CLASSES.items()}


def error_code(error: BaseException) -> int:
    """The code of ``error``'s most specific walsvc class (``WAL_ERROR`` for any other
    exception: the node's own failure)."""
    for cls in type(error).__mro__:
        code = _CODES.get(cls)
        if code is not None:
            return code
    return ErrorCode.WAL_ERROR


def error_from(code: int, message: str) -> WALError:
    """The walsvc error a peer's ``code`` and ``message`` stand for (``WALError`` for a
    code this version does not know)."""
    return _CLASSES.get(code, WALError)(message)


def negotiate(client: tuple[int, int], node: tuple[int, int] = NODE_VERSIONS) -> int | None:
    """The highest version both ranges hold, or None."""
    high = min(client[1], node[1])
    return high if high >= max(client[0], node[0]) else None


def array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` items (fixarray, array 16, array 32)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")
