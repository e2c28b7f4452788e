"""The connections aiokafka opens while a client starts, so that a start which fails or
is cancelled closes every one of them.

aiokafka's ``AIOKafkaClient.bootstrap`` holds its first connection in a local variable
while it asks that broker for the cluster's metadata. A cancellation there (the caller
gave up, or ``connect_timeout`` ran out) leaves the connection open and unreachable: the
client's ``close`` does not know it, and it lingers until the garbage collector finds it
(an ``Unclosed AIOKafkaConnection`` warning, after the loop may have closed). Its kin,
aio-libs/aiokafka#715, is open upstream.

aiokafka's client looks ``create_conn`` up in its module when it connects; walsvc puts
a wrapper there (once, on import) that, inside ``opened_connections()``, records every
connection made in that context. Outside such a block it only forwards the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import aiokafka.client

__all__ = ("OpenedConnections", "opened_connections")


class OpenedConnections:
    """The connections opened in one context while its ``opened_connections()`` block
    ran (tasks started in it share the record until the block ends)."""

    def __init__(self) -> None:
        self.connections: list[Any] = []
        self.recording = True

    def close_all(self) -> None:
        """Close every recorded connection (a closed one is left as it is)."""
        for connection in self.connections:
            with contextlib.suppress(Exception):
                connection.close()


_opening: ContextVar[OpenedConnections | None] = ContextVar("walsvc_kafka_opening", default=None)


@contextlib.contextmanager
def opened_connections() -> Iterator[OpenedConnections]:
    """Record the connections aiokafka opens in this context until the block ends."""
    opened = OpenedConnections()
    token = _opening.set(opened)
    try:
        yield opened
    finally:
        opened.recording = False
        _opening.reset(token)


_aiokafka_create_conn = aiokafka.client.create_conn


async def _create_conn(*args: Any, **kwargs: Any) -> Any:
    """aiokafka's ``create_conn``, and the connection recorded if a block records."""
    connection = await _aiokafka_create_conn(*args, **kwargs)
    opened = _opening.get()
    if opened is not None and opened.recording:
        opened.connections.append(connection)
    return connection


if getattr(aiokafka.client.create_conn, "__module__", None) != __name__:
    aiokafka.client.create_conn = _create_conn
