"""Asking a node for its status (``walsvc status``): a connection of its own, one
``Status`` request, the ``NodeStatus`` the node answers. No WAL needs to be open."""

from __future__ import annotations

import ssl

from ._connection import Connection
from ._dial import node_address
from ._node_status import NodeStatus
from ._protocol import Status, StatusIs

__all__ = ("fetch_status",)


async def fetch_status(
    url: str,
    *,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    connect_timeout: float = 10.0,
    subscriptions: bool = False,
) -> NodeStatus:
    """The status of the node at ``url`` (``walsvc://host:port``): its pchannels,
    connections and streams, and with ``subscriptions`` each pchannel's durable
    subscriptions (``PchannelStatus.subscriptions``, None from a node that does not
    report them). ``token``, ``tls`` and ``connect_timeout`` as for
    ``open_wal``; how long to wait for the answer is the caller's scope's
    (``asyncio.timeout``). Raises ``BackendUnavailable`` if the node cannot be reached,
    ``Unauthenticated`` if it refuses the token."""
    host, port = node_address(url)
    conn = await Connection.connect(
        host, port, token=token, tls=tls, connect_timeout=connect_timeout
    )
    try:
        request = conn.next_id()
        answer: StatusIs = await conn.request(Status(request, subscriptions), request).future
    finally:
        await conn.aclose()
    return answer.status
