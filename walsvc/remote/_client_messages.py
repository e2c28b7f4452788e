"""The messages a client sends to a node (docs/protocol.md, "Client -> node"), and the
part several of them carry, ``WireMessage`` (a message to append).

A node decodes the items of a client's frame as ``ClientMessage``. Fields a version
added come last, with defaults, so a message without them still decodes. The tags of
both directions are listed in docs/protocol.md; a new message takes one neither uses.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

__all__ = (
    "MAX_CREDIT",
    "Ack",
    "Append",
    "AppendMany",
    "ClientMessage",
    "CloseStream",
    "CloseWal",
    "Credit",
    "CreditAmount",
    "DeleteSubscription",
    "Flush",
    "Hello",
    "LatestId",
    "OpenWal",
    "Ping",
    "Read",
    "Recall",
    "Status",
    "Truncate",
    "TxnAppend",
    "TxnBegin",
    "TxnCommit",
    "TxnResume",
    "TxnRollback",
    "WireMessage",
)

#: The most credit a stream may be granted or hold, in messages and in bytes (u32): a
#: peer that grants more, or a negative amount, breaks the protocol.
MAX_CREDIT: Final = 2**32 - 1
#: A credit field: its decoding refuses what MAX_CREDIT does not allow.
CreditAmount = Annotated[int, msgspec.Meta(ge=0, le=MAX_CREDIT)]


class WireMessage(msgspec.Struct, array_like=True, frozen=True):
    """A message to append: ``walsvc.Message`` without ``txn``."""

    payload: bytes
    vchannel: str
    type: int
    properties: dict[str, str]
    idempotency_key: str | None


class Hello(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """The first frame a client sends, alone: the versions it speaks and its token."""

    min_version: int
    max_version: int
    token: str | None
    client: str


class OpenWal(msgspec.Struct, array_like=True, frozen=True, tag=2):
    """Open ``pchannel`` on the node; answered by ``Opened`` or ``Failed``. Version 3:
    ``producer`` names who appends through the handle, and ``epoch`` counts its openings
    (see ``walsvc.service._fences``: a later opening fences the earlier one's handle)."""

    request: int
    pchannel: str
    read_only: bool
    producer: str | None = None
    epoch: int = 0


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
    """Stop the stream; the node answers ``StreamEnded`` (code OK, or the error that
    ended the stream first)."""

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
    """The node's status (no WAL needs to be open); answered by ``StatusIs``. With
    ``subscriptions`` the node also lists each pchannel's durable subscriptions, which
    reads their store (a node that predates the field ignores it and lists none)."""

    request: int
    subscriptions: bool = False


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


class Recall(msgspec.Struct, array_like=True, frozen=True, tag=49):
    """Version 3: what became of appends whose answers a lost connection took, before
    they are sent again: per ``[vchannel, idempotency_key]`` of ``keys``, each sent
    after the client had received an answer with timetick ``since_tick``, the result
    of the message that landed with it, or nil if none did. Answered by ``Recalled``
    (``LocalWAL.recall_keys`` on the node) or ``Failed``."""

    request: int
    wal: int
    since_tick: int
    keys: list[tuple[str, str]]


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
    | Recall
)
