"""The messages a node sends to a client (docs/protocol.md, "Node -> client"), and the
parts they carry: ``WireResult`` (an append's result) and ``WireDelivered`` (a message
read).

A client decodes the items of a node's frame as ``NodeMessage``. A node sends a message
only on a connection whose version has it (``StreamStats``: version 2). The tags of both
directions are listed in docs/protocol.md; a new message takes one neither uses.
"""

from __future__ import annotations

import msgspec

from ._node_status import NodeStatus

__all__ = (
    "AckFailed",
    "Appended",
    "Delivered",
    "Done",
    "Failed",
    "GoingAway",
    "LatestIdIs",
    "NodeMessage",
    "Opened",
    "Pong",
    "Refused",
    "StatusIs",
    "StreamEnded",
    "StreamStarted",
    "StreamStats",
    "TxnBegun",
    "Welcome",
    "WireDelivered",
    "WireResult",
)


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
    handle is read-only, the URL scheme of the ids it returns and (version 3) the newest
    timetick the node had given a message of it (0: none, or not said), which every
    message appended from now on exceeds."""

    request: int
    wal: int
    term: int
    read_only: bool
    scheme: str
    timetick: int = 0


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


class Recalled(msgspec.Struct, array_like=True, frozen=True, tag=32):
    """Version 3: the answer to ``Recall``, one item per key in its order: the result
    of the message that landed with it, or nil (it did not land: send it again)."""

    request: int
    results: list[WireResult | None]


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
    | Recalled
)
