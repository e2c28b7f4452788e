"""A node's status as it travels in ``StatusIs`` (docs/protocol.md, "Status"): the node,
its limits, its pchannels, its connections and their streams.

Unlike the protocol's messages these structs are msgpack **maps** keyed by field name:
a later node may add fields within protocol version 1, and a reader ignores the keys it
does not know. Times are Unix seconds (``connected_at``, ``started_at``) or seconds
(``uptime``); byte counts are bytes.
"""

from __future__ import annotations

import math

import msgspec

from walsvc.core._errors import InvalidArgument

__all__ = (
    "MAX_SUBSCRIPTIONS",
    "ConnectionStatus",
    "HandleStatus",
    "NodeLimits",
    "NodeStatus",
    "PchannelStatus",
    "StreamStatus",
    "SubscriptionStatus",
)


class NodeLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What a node allows its peers (``walsvc.serve(limits=...)``; ``walsvc serve``'s
    flags), in seconds and bytes.

    ``handshake_timeout``: a connection must complete its handshake (TLS included)
    within it. ``frame_timeout``: a frame whose length prefix arrived must complete
    within it (a peer trickling a frame is cut off). ``idle_timeout``: a peer that sends
    no frame for that long is cut off (None, the default: never; the reference client
    pings only when the node is silent, so one that receives a slow stream may send
    nothing for long). ``send_queue_bytes``: above this many bytes queued for a peer,
    the node stops reading its requests and feeding its streams until half of them went
    out; ``stall_timeout``: a peer that stays above it that long is cut off.
    ``max_in_flight`` requests, or requests holding
    ``max_in_flight_bytes`` of messages (payloads plus 64 bytes each; a ``Status``
    counts 1 MiB), may wait for their answers per connection; beyond either the node
    reads no more of that peer's requests until half of them were answered."""

    handshake_timeout: float = 10.0
    frame_timeout: float = 30.0
    idle_timeout: float | None = None
    send_queue_bytes: int = 64 * 1024 * 1024
    stall_timeout: float = 60.0
    max_in_flight: int = 4096
    max_in_flight_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("handshake_timeout", "frame_timeout", "idle_timeout", "stall_timeout"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name} must be a number of seconds > 0, not {value!r}")
        for name in ("send_queue_bytes", "max_in_flight", "max_in_flight_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be at least 1, not {getattr(self, name)!r}")


class StreamStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One stream (a remote scanner): what it reads, what it was sent, its credit.
    ``waiting_for_credit`` is the pressure signal: the node holds messages for it and
    waits for its reader to grant credit; ``waiting_for_send``: they wait for the
    connection's queue to fall below its limit."""

    stream: int
    pchannel: str
    deliver: str
    filter: str
    delivered: int
    credit_messages: int
    credit_bytes: int
    waiting_for_credit: bool
    waiting_for_send: bool


class HandleStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One WAL a connection opened (``OpenWal``)."""

    handle: int
    pchannel: str
    read_only: bool


class ConnectionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One client connection after its handshake. ``in_flight``: requests received and
    not answered yet; ``queued_bytes``: answers and deliveries the node holds for the
    client and the client has not taken yet; ``reading_paused``: above
    ``NodeLimits.send_queue_bytes``, the node reads no more of its requests;
    ``version``: the protocol version the connection speaks (during a rolling upgrade,
    which clients still speak an older one)."""

    connection: int
    peer: str
    connected_at: float
    handles: list[HandleStatus]
    in_flight: int
    queued_bytes: int
    reading_paused: bool
    streams: list[StreamStatus]
    version: int = 1


class SubscriptionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A durable subscription of a pchannel the node writes: its name, the checkpoint
    it resumes after (marshalled) and that checkpoint's timetick, the scope it reads
    (None for one stored before walsvc kept scopes) and how many of the node's scanners
    read it now."""

    name: str
    checkpoint: str
    timetick: int
    scope: str | None
    readers: int


class PchannelStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One pchannel the node writes: its writer's term, the newest timetick it
    allocated, the id of the newest message in the log (None: none yet, or the backend
    did not answer in time) and how many handles of all connections name it.
    ``subscriptions``: its durable subscriptions, the first ``MAX_SUBSCRIPTIONS`` by name
    (``omitted_subscriptions`` counts the others); None when the node does not report
    them (the ``Status`` did not ask, a node older than this field, a backend that keeps
    none, a store that did not answer in time, or an answer too big for a frame)."""

    pchannel: str
    term: int
    last_timetick: int
    latest_message_id: str | None
    handles: int
    subscriptions: list[SubscriptionStatus] | None = None
    omitted_subscriptions: int = 0


#: How many subscriptions a pchannel's status lists at most (the answer fits a frame).
MAX_SUBSCRIPTIONS = 100


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A node's status: ``version`` is walsvc's on the node, ``min_version`` and
    ``max_version`` the protocol versions it speaks, ``url`` the log it serves (a
    password in it masked), ``listen`` its address, ``draining`` whether it is shutting
    down (``GoingAway`` sent), ``refused_peers`` how many peers it cut off for breaking
    the protocol or its limits. ``omitted_connections``: how many connections (the
    last ones, with their streams) were left out of ``connections`` so that the answer
    fits in a frame."""

    version: str
    min_version: int
    max_version: int
    url: str
    listen: str
    started_at: float
    uptime: float
    draining: bool
    refused_peers: int
    limits: NodeLimits
    pchannels: list[PchannelStatus]
    connections: list[ConnectionStatus]
    omitted_connections: int = 0
