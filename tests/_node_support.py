"""What the ``walsvc.open_node`` tests share (``test_node.py``, ``test_node_routing.py``,
``test_node_migration.py``): pchannel lists, a plain message, and reads of a vchannel's
application messages (to an end marker, from the start, the first few)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import walsvc
from walsvc import ImmutableMessage, Message, MessageType, Node
from walsvc.node._node import NodeScanner

__all__ = ("P3", "P4", "data_of", "first", "msg", "read_to_end", "replay")

#: The pchannel lists most tests open their node over.
P3 = ("p0", "p1", "p2")
P4 = ("p0", "p1", "p2", "p3")


def msg(payload: bytes, vchannel: str) -> Message:
    """A plain message of ``payload`` on ``vchannel``."""
    return Message(payload=payload, vchannel=vchannel)


def data_of(message: ImmutableMessage) -> list[ImmutableMessage]:
    """The application messages in a delivered message: a committed transaction's body,
    or the message itself; none for system messages."""
    items = message.body if message.type is MessageType.TXN else (message,)
    return [m for m in items if m.type not in walsvc.SYSTEM_TYPES]


async def read_to_end(scanner: NodeScanner, end: bytes) -> list[bytes]:
    """Payloads of the application messages up to ``end`` (excluded), end markers of
    earlier reads (``b"end-..."``) left out."""
    out: list[bytes] = []
    async with asyncio.timeout(20), scanner:
        async for message in scanner:
            for m in data_of(message):
                if m.payload == end:
                    return out
                if not m.payload.startswith(b"end-"):
                    out.append(m.payload)
    raise AssertionError("the scanner ended before the end marker")


async def replay(node: Node, vchannel: str) -> list[bytes]:
    """Every payload of ``vchannel`` (broadcasts included) from the start, in order."""
    end = b"end-" + uuid.uuid4().hex.encode()
    await node.append(msg(end, vchannel))
    return await read_to_end(node.read(vchannel), end)


async def first(scanner: NodeScanner, n: int) -> AsyncIterator[ImmutableMessage]:
    """The first ``n`` application messages of ``scanner``."""
    seen = 0
    async with asyncio.timeout(20):
        async for message in scanner:
            if message.type not in walsvc.SYSTEM_TYPES:
                yield message
                seen += 1
                if seen == n:
                    return
