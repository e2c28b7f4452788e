"""A node's status as it travels in ``StatusIs`` (docs/protocol.md, "Status"): the node,
its pchannels, its connections and their streams.

Unlike the protocol's messages these structs are msgpack **maps** keyed by field name:
a later node may add fields within protocol version 1, and a reader ignores the keys it
does not know. Times are Unix seconds (``connected_at``, ``started_at``) or seconds
(``uptime``); byte counts are bytes.
"""

from __future__ import annotations

import msgspec

__all__ = (
    "ConnectionStatus",
    "HandleStatus",
    "NodeStatus",
    "PchannelStatus",
    "StreamStatus",
)


class StreamStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One stream (a remote scanner): what it reads, what it was sent, its credit.
    ``waiting_for_credit`` is the pressure signal: the node holds messages for it and
    waits for its reader to grant credit."""

    stream: int
    pchannel: str
    deliver: str
    filter: str
    delivered: int
    credit_messages: int
    credit_bytes: int
    waiting_for_credit: bool


class HandleStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One WAL a connection opened (``OpenWal``)."""

    handle: int
    pchannel: str
    read_only: bool


class ConnectionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One client connection after its handshake. ``in_flight``: requests received and
    not answered yet; ``queued_bytes``: answers and deliveries the node holds for the
    client and the client has not taken yet."""

    connection: int
    peer: str
    connected_at: float
    handles: list[HandleStatus]
    in_flight: int
    queued_bytes: int
    streams: list[StreamStatus]


class PchannelStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One pchannel the node writes: its writer's term, the newest timetick it
    allocated, the id of the newest message in the log (None: none yet, or the backend
    did not answer in time) and how many handles of all connections name it."""

    pchannel: str
    term: int
    last_timetick: int
    latest_message_id: str | None
    handles: int


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A node's status: ``version`` is walsvc's on the node, ``min_version`` and
    ``max_version`` the protocol versions it speaks, ``url`` the log it serves (a
    password in it masked), ``listen`` its address, ``draining`` whether it is shutting
    down (``GoingAway`` sent), ``refused_peers`` how many peers it cut off for breaking
    the protocol or its limits."""

    version: str
    min_version: int
    max_version: int
    url: str
    listen: str
    started_at: float
    uptime: float
    draining: bool
    refused_peers: int
    pchannels: list[PchannelStatus]
    connections: list[ConnectionStatus]
