"""The node's status (``NodeServer.status``, the answer to ``Status``), read from its
WALs, connections and streams at the moment it is asked.

A friend of ``_server``: it reads the private state of the node, and its sessions and
their streams, and changes none of it. Building it awaits only each pchannel's latest
id (bounded by ``_LATEST_ID_TIMEOUT``), so a slow backend delays a status, never blocks
the node.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import re
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import msgspec

from walsvc.core._errors import InvalidArgument
from walsvc.remote._node_status import (
    MAX_SUBSCRIPTIONS,
    ConnectionStatus,
    HandleStatus,
    NodeStatus,
    PchannelStatus,
    StreamStatus,
    SubscriptionStatus,
)
from walsvc.remote._protocol import MAX_FRAME_BYTES, NODE_VERSIONS, Read, Status, StatusIs
from walsvc.wal._wal import LocalWAL

from ._wire import encode

if TYPE_CHECKING:
    from ._server import NodeServer
    from ._session import Session

__all__ = (
    "answer_status",
    "filter_summary",
    "fit_in_frame",
    "host_port",
    "masked_url",
    "node_gauges",
    "node_status",
)

#: How long a status waits for a backend's latest message id.
_LATEST_ID_TIMEOUT: Final = 2.0
#: How many vchannels or types a stream's filter summary names before it counts the rest.
_SHOWN: Final = 4
_PASSWORD: Final = re.compile(r"(?<=://)([^/@:]*):[^/@]*@")
#: The most a status may take encoded: a frame, less the room for its frame's array
#: header and ``StatusIs``'s own fields.
_STATUS_BYTES: Final = MAX_FRAME_BYTES - 64
#: The msgpack headers of the connections array can grow from 1 byte to 5 as it fills.
_ARRAY_HEADER_GROWTH: Final = 4


@functools.cache
def _version() -> str:
    try:
        return importlib.metadata.version("walsvc")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def host_port(address: Any) -> str:
    """A socket address as ``host:port`` (``[host]:port`` for IPv6)."""
    if not isinstance(address, tuple) or len(address) < 2:
        return str(address)
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def masked_url(url: str) -> str:
    """``url`` with the password of its user info (``scheme://user:password@host``)
    masked."""
    return _PASSWORD.sub(r"\1:***@", url)


def _names(items: list[str]) -> str:
    shown = ",".join(items[:_SHOWN])
    return shown if len(items) <= _SHOWN else f"{shown},... ({len(items)})"


def filter_summary(read: Read) -> str:
    """What a stream reads, in a few words: ``everything`` or its filter's parts."""
    parts = []
    if read.vchannels is not None:
        parts.append(f"vchannels={_names(read.vchannels)}")
    if read.types is not None:
        parts.append(f"types={_names([str(t) for t in read.types])}")
    if read.min_timetick:
        parts.append(f"min_timetick={read.min_timetick}")
    if read.timeticks:
        parts.append("timeticks")
    if read.raw:
        parts.append("raw")
    return " ".join(parts) or "everything"


async def _latest(wal: LocalWAL) -> str | None:
    try:
        async with asyncio.timeout(_LATEST_ID_TIMEOUT):
            latest = await wal.latest_message_id()
    except Exception:  # a failing or slow backend: a status reports what it can
        return None
    return None if latest is None else latest.marshal()


async def _subscriptions(wal: LocalWAL) -> tuple[list[SubscriptionStatus] | None, int]:
    """The first ``MAX_SUBSCRIPTIONS`` durable subscriptions of ``wal``'s pchannel by
    name, and how many more there are; None if its backend keeps none or its store does
    not answer within the status's patience (a status reports what it can)."""
    try:
        store = wal.backend.subscriptions()
    except InvalidArgument:
        return None, 0
    try:
        async with asyncio.timeout(_LATEST_ID_TIMEOUT):
            shown, omitted = await store.listed(MAX_SUBSCRIPTIONS)
    except Exception:
        return None, 0
    readers = Counter(name for name, _ in wal.subscription_stats())
    found = [
        SubscriptionStatus(
            name=name,
            checkpoint=stored.checkpoint.marshal(),
            timetick=stored.checkpoint.timetick,
            scope=None if stored.scope is None else stored.scope.description,
            readers=readers[name],
        )
        for name, stored in shown
    ]
    return found, omitted


def _connection(session: Session) -> ConnectionStatus:
    streams = []
    for number, stream in session.streams.items():
        read = stream.read
        found = session.handles.get(read.wal)
        streams.append(
            StreamStatus(
                stream=number,
                pchannel="" if found is None else found[0].pchannel,
                deliver=read.deliver,
                filter=filter_summary(read),
                delivered=stream.delivered,
                credit_messages=stream.messages,
                credit_bytes=stream.bytes,
                waiting_for_credit=stream.waiting_for_credit,
                waiting_for_send=stream.waiting_for_send,
            )
        )
    return ConnectionStatus(
        connection=session.number,
        peer=session.peer,
        connected_at=session.connected_at,
        handles=[
            HandleStatus(handle=handle, pchannel=wal.pchannel, read_only=read_only)
            for handle, (wal, read_only) in list(session.handles.items())
        ],
        in_flight=len(session.in_flight),
        queued_bytes=session.writer.queued_bytes,
        reading_paused=session.watchdog is not None and not session.watchdog.reading,
        streams=streams,
        version=session.version,
    )


def node_gauges(node: NodeServer) -> dict[str, float]:
    """What a metrics scrape reads of ``node`` now: its connections, their streams
    (and those waiting for the reader's credit: pressure), requests in flight, bytes
    queued for clients, peers refused, whether it drains. Memory only, no await."""
    sessions = list(node._live)
    streams = [stream for session in sessions for _, stream in session.streams.items()]
    return {
        "connections": len(sessions),
        "streams": len(streams),
        "streams_waiting_for_credit": sum(1 for s in streams if s.waiting_for_credit),
        "requests_in_flight": sum(len(session.in_flight) for session in sessions),
        "queued_bytes": sum(session.writer.queued_bytes for session in sessions),
        "refused_peers": node.refused_peers,
        "draining": 1 if node.draining else 0,
    }


async def node_status(node: NodeServer, subscriptions: bool = False) -> NodeStatus:
    """The status of ``node`` now; with ``subscriptions``, each pchannel's durable
    subscriptions too."""
    wals = sorted(node._wals.items())
    latest = await asyncio.gather(*(_latest(wal) for _, wal in wals))
    subscribed: list[tuple[list[SubscriptionStatus] | None, int]] = (
        await asyncio.gather(*(_subscriptions(wal) for _, wal in wals))
        if subscriptions
        else [(None, 0)] * len(wals)
    )
    sessions = sorted(node._live, key=lambda s: s.number)
    handles = Counter(wal.pchannel for s in sessions for wal, _ in s.handles.values())
    return NodeStatus(
        version=_version(),
        min_version=NODE_VERSIONS[0],
        max_version=NODE_VERSIONS[1],
        url=masked_url(node.url),
        listen=host_port(node.address),
        started_at=node.started_at,
        uptime=time.monotonic() - node._started,
        draining=node.draining,
        refused_peers=node.refused_peers,
        limits=node.limits,
        pchannels=[
            PchannelStatus(
                pchannel=name,
                term=wal.term,
                last_timetick=wal.last_timetick,
                latest_message_id=latest_id,
                handles=handles[name],
                subscriptions=found,
                omitted_subscriptions=omitted,
            )
            for (name, wal), latest_id, (found, omitted) in zip(
                wals, latest, subscribed, strict=True
            )
        ],
        connections=[_connection(session) for session in sessions],
    )


def fit_in_frame(status: NodeStatus, limit: int = _STATUS_BYTES) -> NodeStatus:
    """``status`` if it takes at most ``limit`` bytes encoded; else a copy with only the
    first of its connections that fit (each whole, with its streams) and the others
    counted in ``omitted_connections``, and without the pchannels' subscriptions (None:
    not reported) if even the rest does not fit. A status answer never exceeds a frame
    (one that did would never reach its asker)."""
    if len(encode(status)) <= limit:
        return status
    if len(encode(msgspec.structs.replace(status, connections=[]))) > limit:
        unlisted = [
            msgspec.structs.replace(p, subscriptions=None, omitted_subscriptions=0)
            for p in status.pchannels
        ]
        status = msgspec.structs.replace(status, pchannels=unlisted)
    connections = status.connections
    bare = msgspec.structs.replace(status, connections=[], omitted_connections=len(connections))
    room = limit - len(encode(bare)) - _ARRAY_HEADER_GROWTH
    kept = 0
    for connection in connections:
        room -= len(encode(connection))
        if room < 0:
            break
        kept += 1
    return msgspec.structs.replace(
        status, connections=connections[:kept], omitted_connections=len(connections) - kept
    )


async def answer_status(session: Session, request: Status) -> None:
    """Answer ``request``, a ``Status`` of ``session``'s client (within a frame: see
    ``fit_in_frame``)."""
    try:
        status = fit_in_frame(await node_status(session.node, request.subscriptions))
    except Exception as exc:
        session.fail(request.request, exc)
        return
    session.send(StatusIs(request.request, status))
