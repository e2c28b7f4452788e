"""``memory_wal``: a private in-memory WAL for users' own unit tests."""

from __future__ import annotations

import uuid
from typing import Any

from walsvc.wal._api import WAL
from walsvc.wal._open import open_wal

__all__ = ("memory_wal",)


async def memory_wal(pchannel: str = "pchannel-0", **options: Any) -> WAL:
    """Open ``pchannel`` of a new ``memory://`` log that no other call can see.

    Every call gets a log of its own (its name is a fresh UUID), so tests never share
    state and need no cleanup beyond closing the WAL. ``options`` are those of
    ``walsvc.open_wal`` (``read_only``, ``max_message_size``, ``timetick_allocator``);
    the memory backend itself takes none. To reopen the same log later (a simulated
    restart), call ``walsvc.open_wal("memory://NAME", pchannel)`` with a name of your own
    instead. Example::

        import walsvc
        from walsvc.testing import memory_wal

        async def test_roundtrip() -> None:
            async with await memory_wal() as wal:
                sent = await wal.append(walsvc.Message(payload=b"x", vchannel="v1"))
                async with wal.read() as scanner:
                    message = await anext(scanner)
            assert message.message_id == sent.message_id
            assert message.payload == b"x"
    """
    return await open_wal(f"memory://{uuid.uuid4().hex}", pchannel, **options)
