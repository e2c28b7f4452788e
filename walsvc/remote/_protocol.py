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
"""

from __future__ import annotations

import struct
from typing import Annotated, Final

import msgspec

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

from ._node_status import NodeStatus

__all__ = (
    "FRAME_HEADER",
    "MAX_CREDIT",
    "MAX_FRAME_BYTES",
    "NODE_VERSIONS",
    "PRODUCER_KEY_PREFIX",
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
NODE_VERSIONS: Final = (1, 2)
#: The first version with ``StreamStats``: a node sends it only on a connection that
#: negotiated this version or a later one (an older client could not decode it).
STREAM_STATS_VERSION: Final = 2
#: A frame's length prefix: 4 bytes, big-endian, unsigned; counts the body only.
FRAME_HEADER: Final = struct.Struct(">I")
#: The largest frame body either side accepts: 16 MiB of messages plus 64 KiB of
#: overhead. A longer prefix ends the connection (that peer's alone).
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024 + 64 * 1024
#: The most credit a stream may be granted or hold, in messages and in bytes (u32): a
#: peer that grants more, or a negative amount, breaks the protocol.
MAX_CREDIT: Final = 2**32 - 1
#: A credit field: its decoding refuses what MAX_CREDIT does not allow.
CreditAmount = Annotated[int, msgspec.Meta(ge=0, le=MAX_CREDIT)]


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


# -- the parts of messages --------------------------------------------------------------


class WireMessage(msgspec.Struct, array_like=True, frozen=True):
    """A message to append: ``walsvc.Message`` without ``txn``."""

    payload: bytes
    vchannel: str
    type: int
    properties: dict[str, str]
    idempotency_key: str | None


class WireResult(msgspec.Struct, array_like=True, frozen=True):
    """An ``AppendResult``; ids as ``MessageId.marshal()`` text."""

    message_id: str
    timetick: int
    last_confirmed_id: str | None


class WireDelivered(msgspec.Struct, array_like=True, frozen=True):
    """An ``ImmutableMessage`` as delivered; ids as ``MessageId.marshal()`` text, ``txn``
    as [txn_id, keepalive_ms], ``body`` the messages of a ``TXN``."""

    message_id: str
    timetick: int
    vchannel: str
    type: int
    payload: bytes
    properties: dict[str, str]
    last_confirmed_id: str | None
    txn: tuple[int, int] | None
    idempotency_key: str | None
    term: int
    persisted: bool
    durable_tick: int
    body: list[WireDelivered]


# -- client -> node -----------------------------------------------------------------------


class Hello(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """The first frame a client sends, alone: the versions it speaks and its token."""

    min_version: int
    max_version: int
    token: str | None
    client: str


class OpenWal(msgspec.Struct, array_like=True, frozen=True, tag=2):
    """Open ``pchannel`` on the node; answered by ``Opened`` or ``Failed``."""

    request: int
    pchannel: str
    read_only: bool


class Append(msgspec.Struct, array_like=True, frozen=True, tag=3):
    """``WAL.append`` on the handle ``wal``; answered by ``Appended`` (one result)."""

    request: int
    wal: int
    message: WireMessage


class AppendMany(msgspec.Struct, array_like=True, frozen=True, tag=4):
    """``WAL.append_many`` on the handle ``wal``; answered by ``Appended``."""

    request: int
    wal: int
    messages: list[WireMessage]


class LatestId(msgspec.Struct, array_like=True, frozen=True, tag=5):
    """``WAL.latest_message_id``; answered by ``LatestIdIs``."""

    request: int
    wal: int


class Read(msgspec.Struct, array_like=True, frozen=True, tag=6):
    """Open the stream ``stream`` (a number the client picks, unique on the connection):
    ``WAL.read`` with a deliver policy, a filter and an initial credit. The node answers
    with ``Delivered`` frames within the credit, and ``StreamEnded`` when it stops."""

    stream: int
    wal: int
    deliver: str
    deliver_id: str | None
    after_timetick: int
    vchannels: list[str] | None
    types: list[int] | None
    min_timetick: int
    timeticks: bool
    raw: bool
    txn_buffer_bytes: int
    credit_messages: CreditAmount
    credit_bytes: CreditAmount
    #: ``WAL.read(subscription=...)``: the durable subscription the stream reads (nil:
    #: none) and how often its checkpoint is written (seconds). Last, with defaults, so a
    #: ``Read`` without them still decodes.
    subscription: str | None = None
    checkpoint_interval: float = 1.0


class Credit(msgspec.Struct, array_like=True, frozen=True, tag=7):
    """Grant the stream more credit (messages and payload bytes the client consumed)."""

    stream: int
    messages: CreditAmount
    bytes: CreditAmount


class CloseStream(msgspec.Struct, array_like=True, frozen=True, tag=8):
    """Stop the stream; the node answers ``StreamEnded`` (code OK)."""

    stream: int


class CloseWal(msgspec.Struct, array_like=True, frozen=True, tag=9):
    """Release the handle ``wal`` (its streams end); answered by ``Done``."""

    request: int
    wal: int


class Ping(msgspec.Struct, array_like=True, frozen=True, tag=10):
    """Are you there? The node answers ``Pong`` at once (the client's heartbeat: a
    connection that answers nothing within its timeout is dropped and reconnected)."""

    nonce: int


class Status(msgspec.Struct, array_like=True, frozen=True, tag=60):
    """The node's status (no WAL needs to be open); answered by ``StatusIs``."""

    request: int


class TxnBegin(msgspec.Struct, array_like=True, frozen=True, tag=40):
    """``WAL.begin_txn`` on the handle ``wal``; answered by ``TxnBegun``. ``token``
    (version 2): the client's name for this begin, unique to it; a begin resent with a
    token the node has seen gets the first one's transaction, not a new one."""

    request: int
    wal: int
    vchannel: str
    keepalive: float
    idempotency_key: str | None
    token: str | None = None


class TxnResume(msgspec.Struct, array_like=True, frozen=True, tag=41):
    """Take up the node's transaction ``txn_id`` of the handle's pchannel (begun by this
    or an earlier connection); answered by ``TxnBegun``."""

    request: int
    wal: int
    txn_id: int


class TxnAppend(msgspec.Struct, array_like=True, frozen=True, tag=42):
    """``Txn.append`` (one message) or ``Txn.append_many`` (more) of the node's
    transaction ``txn_id``; answered by ``Appended``. ``caller`` and ``seq``: see
    ``TxnCommit``."""

    request: int
    wal: int
    txn_id: int
    messages: list[WireMessage]
    caller: int | None = None
    seq: int | None = None


class TxnCommit(msgspec.Struct, array_like=True, frozen=True, tag=43):
    """``Txn.commit``; answered by ``Appended`` (the CommitTxn's result).

    ``caller`` and ``seq`` (version 2), here and in ``TxnAppend`` and ``TxnRollback``:
    the client's handle of the transaction (a random number in [1, 2^63)) and the number
    of this call among that handle's calls (1, 2, ...; sent in that order). A call the
    node has served for the transaction is answered again, not applied again: a resend
    gets the first call's answer or error."""

    request: int
    wal: int
    txn_id: int
    caller: int | None = None
    seq: int | None = None


class TxnRollback(msgspec.Struct, array_like=True, frozen=True, tag=44):
    """``Txn.rollback``; answered by ``Done``. ``caller`` and ``seq``: see
    ``TxnCommit``."""

    request: int
    wal: int
    txn_id: int
    caller: int | None = None
    seq: int | None = None


class Ack(msgspec.Struct, array_like=True, frozen=True, tag=45):
    """``Scanner.ack`` of a delivered message of the subscription stream ``stream``: the
    message's timetick and checkpoint. No answer; a failure comes as ``AckFailed``."""

    stream: int
    timetick: int
    checkpoint_id: str | None
    checkpoint_tick: int


class Flush(msgspec.Struct, array_like=True, frozen=True, tag=46):
    """``Scanner.flush`` of the stream (``close``: then end it, as ``Scanner.aclose``:
    the subscription is released); answered by ``Done`` once the checkpoint is written."""

    request: int
    stream: int
    close: bool


class Truncate(msgspec.Struct, array_like=True, frozen=True, tag=47):
    """``WAL.truncate(message_id)``; answered by ``Done``."""

    request: int
    wal: int
    message_id: str


class DeleteSubscription(msgspec.Struct, array_like=True, frozen=True, tag=48):
    """``WAL.delete_subscription(name)``; answered by ``Done``."""

    request: int
    wal: int
    name: str


ClientMessage = (
    Hello
    | OpenWal
    | Append
    | AppendMany
    | LatestId
    | Read
    | Credit
    | CloseStream
    | CloseWal
    | Ping
    | Status
    | TxnBegin
    | TxnResume
    | TxnAppend
    | TxnCommit
    | TxnRollback
    | Ack
    | Flush
    | Truncate
    | DeleteSubscription
)


# -- node -> client -----------------------------------------------------------------------


class Welcome(msgspec.Struct, array_like=True, frozen=True, tag=20):
    """The node accepted the handshake and speaks ``version`` on this connection."""

    version: int
    min_version: int
    max_version: int
    node: str


class Refused(msgspec.Struct, array_like=True, frozen=True, tag=21):
    """The node refused the handshake (``code``: UNSUPPORTED_VERSION, UNAUTHENTICATED,
    PROTOCOL_ERROR) and closes the connection; it names the versions it speaks."""

    code: int
    message: str
    min_version: int
    max_version: int


class Opened(msgspec.Struct, array_like=True, frozen=True, tag=22):
    """The pchannel is open: the handle to name it by, the writer's term, whether the
    handle is read-only, and the URL scheme of the ids it returns."""

    request: int
    wal: int
    term: int
    read_only: bool
    scheme: str


class Appended(msgspec.Struct, array_like=True, frozen=True, tag=23):
    """The results of an ``Append`` (one) or ``AppendMany`` (one per message, in order)."""

    request: int
    results: list[WireResult]


class Failed(msgspec.Struct, array_like=True, frozen=True, tag=24):
    """The request failed with the walsvc error ``code`` stands for."""

    request: int
    code: int
    message: str


class LatestIdIs(msgspec.Struct, array_like=True, frozen=True, tag=25):
    """The answer to ``LatestId``."""

    request: int
    message_id: str | None


class Delivered(msgspec.Struct, array_like=True, frozen=True, tag=26):
    """Messages of a stream, in order; never more than its credit."""

    stream: int
    messages: list[WireDelivered]


class StreamEnded(msgspec.Struct, array_like=True, frozen=True, tag=27):
    """The stream stopped: closed (code OK) or failed with a walsvc error."""

    stream: int
    code: int
    message: str


class Done(msgspec.Struct, array_like=True, frozen=True, tag=28):
    """A request that returns nothing succeeded."""

    request: int


class StreamStarted(msgspec.Struct, array_like=True, frozen=True, tag=29):
    """Sent once for a ``latest`` stream when it starts: ``timetick`` is the newest the
    node had allocated, so every message appended after the stream started has a greater
    one (a client resuming the stream with nothing delivered reads from there)."""

    stream: int
    timetick: int


class Pong(msgspec.Struct, array_like=True, frozen=True, tag=30):
    """The answer to ``Ping``, with its nonce."""

    nonce: int


class StreamStats(msgspec.Struct, array_like=True, frozen=True, tag=31):
    """Version 2: the stats of the node's scanner of a stream (``ScannerStats`` but the
    position and the count delivered, which the client knows better): where it reads
    (``"cache"``, ``"backend"``, or ``"not started"`` before a subscription loaded its
    checkpoint), its hand-offs and fallbacks, what its reorder and transaction stages
    rejected or hold, and its subscription's last durable checkpoint as
    [last_confirmed_id, timetick] (nil: none). Sent when the stream starts, at once
    when its source switches, at most once per interval otherwise (only what changed),
    and before a ``Flush``'s ``Done``; each replaces the one before."""

    stream: int
    source: str
    handoffs: int
    fallbacks: int
    rejected: int
    held_for_order: int
    open_txns: int
    txn_bytes: int
    checkpoint: tuple[str | None, int] | None


class StatusIs(msgspec.Struct, array_like=True, frozen=True, tag=70):
    """The answer to ``Status``: the node, its pchannels, connections and streams."""

    request: int
    status: NodeStatus


class GoingAway(msgspec.Struct, array_like=True, frozen=True, tag=71):
    """The node is shutting down (draining): it answers the requests it received, fails
    new ones with ``BACKEND_UNAVAILABLE``, ends the streams and closes the connection
    within ``within_ms`` milliseconds. Not an answer to anything; sent once."""

    reason: str
    within_ms: int


class TxnBegun(msgspec.Struct, array_like=True, frozen=True, tag=50):
    """A transaction handle (the answer to ``TxnBegin`` and ``TxnResume``): its id and
    keepalive, vchannel, key, where its BeginTxn landed, and for a replay (a transaction
    whose key committed earlier) that run's body and commit results."""

    request: int
    txn_id: int
    keepalive_ms: int
    vchannel: str
    idempotency_key: str | None
    begin: WireResult
    replay_bodies: list[WireResult] | None
    replay_commit: WireResult | None


class AckFailed(msgspec.Struct, array_like=True, frozen=True, tag=51):
    """An ``Ack`` of the stream failed (a checkpoint write failed, the scanner closed):
    the client raises the error from the scanner's next ``ack``, ``flush`` or ``aclose``."""

    stream: int
    code: int
    message: str


NodeMessage = (
    Welcome
    | Refused
    | Opened
    | Appended
    | Failed
    | LatestIdIs
    | Delivered
    | StreamEnded
    | Done
    | StreamStarted
    | Pong
    | StreamStats
    | StatusIs
    | GoingAway
    | TxnBegun
    | AckFailed
)
