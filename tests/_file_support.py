"""What the ``file://`` backend's tests share: a bare WAL, its URL, the messages they append
and a read of the whole log back."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import walsvc
from walsvc import DeliverPolicy, ImmutableMessage, Message, MessageType
from walsvc.backends._file import FileMessageId

__all__ = ("SMALL_SEGMENT", "file_url", "open_bare", "random_message", "read_all", "seq_of")

SMALL_SEGMENT = 4096


def open_bare(*args: Any, **kwargs: Any) -> Awaitable[walsvc.WAL]:
    """A bare WAL (no interceptors): the log holds exactly what the test appends, with no
    TimeTicks, because these tests are about the backend underneath."""
    kwargs.setdefault("interceptors", [])
    return walsvc.open_wal(*args, **kwargs)


def file_url(root: Path) -> str:
    """The URL of the ``file://`` logs under ``root``."""
    return f"file://{root}"


def seq_of(message_id: walsvc.MessageId | None) -> int:
    """The record number of a ``file://`` message id."""
    assert isinstance(message_id, FileMessageId)
    return message_id.seq


def random_message(rng: random.Random, i: int, size: int | None = None) -> Message:
    """Message ``i`` of a test's log: its number, then ``size`` random bytes (a random size
    if not given), on one of five vchannels."""
    if size is None:
        size = rng.choice([0, 10, rng.randrange(2000), rng.randrange(9000)])
    return Message(
        payload=i.to_bytes(4, "little") + rng.randbytes(size),
        vchannel=f"v{i % 5}",
        type=(MessageType.INSERT, MessageType.DELETE)[i % 2],
        properties={"i": str(i)},
    )


async def read_all(wal: walsvc.WAL, deliver: DeliverPolicy | None = None) -> list[ImmutableMessage]:
    """The log from ``deliver``'s start (its first record if not given) up to the latest
    id when the read starts."""
    last = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    if last is None:
        return out
    async with asyncio.timeout(20), wal.read(deliver or DeliverPolicy.all()) as scanner:
        async for message in scanner:
            out.append(message)
            if message.message_id >= last:
                break
    return out
