"""Reads after a lost acknowledgement: the append landed in the log, but the WAL was told
it failed (``AppendOutcomeUnknown``). The writer's newest acknowledged id is then older
than the log's newest, and the tail cache must not take it as the end of the log: a
reader from the landed message, or tailing from before it, gets it from the backend.

The faults come from ``tests/_faulty.py`` (a memory backend that writes and then
raises): ``faultymem://`` acknowledges through ``append``, ``faultynow://`` through
``append_now`` (``immediate_acks``), which a WAL without interceptors calls for a plain
append (``SerializationPoint.serialize_now``). Before the fix, a read from the landed
message's id waited for the next append, and a reader tailing the cache of a WAL without
interceptors on ``faultynow://`` skipped the landed message.
"""

from __future__ import annotations

import asyncio
import uuid

import _faulty
import pytest

import interceptors
import walsvc
from walsvc import DeliverPolicy, ImmutableMessage, Message, MessageType

pytestmark = pytest.mark.parametrize(
    ("scheme", "chain"),
    [
        (_faulty.SCHEME, "default"),
        (_faulty.NOW_SCHEME, "default"),
        (_faulty.NOW_SCHEME, "none"),  # plain appends through append_now
    ],
)


async def _open(scheme: str, chain: str) -> walsvc.WAL:
    _faulty.register()
    members = interceptors.default_chain(sync_interval=None) if chain == "default" else []
    return await walsvc.open_wal(f"{scheme}://{uuid.uuid4().hex}", "p", interceptors=members)


async def _append_losing_the_ack(wal: walsvc.WAL, payload: bytes) -> None:
    _faulty.FaultyBackend.faults["p"] = ["lost-ack"]
    try:
        with pytest.raises(walsvc.AppendOutcomeUnknown):
            await wal.append(Message(payload=payload, vchannel="v"))
    finally:
        _faulty.FaultyBackend.faults["p"] = []


async def _first_inserts(
    scanner: walsvc.Scanner, count: int, *, seconds: float = 5.0
) -> list[ImmutableMessage]:
    got: list[ImmutableMessage] = []
    async with asyncio.timeout(seconds):
        async for message in scanner:
            if message.type is MessageType.INSERT:
                got.append(message)
                if len(got) == count:
                    return got
    return got


async def test_a_read_from_the_landed_message_delivers_it(scheme: str, chain: str) -> None:
    wal = await _open(scheme, chain)
    try:
        first = await wal.append(Message(payload=b"a", vchannel="v"))
        await _append_losing_the_ack(wal, b"b")
        landed = await wal.latest_message_id()
        assert landed is not None
        assert landed > first.message_id
        for deliver in (
            DeliverPolicy.start_from(landed),
            DeliverPolicy.start_after(first.message_id),
        ):
            async with wal.read(deliver) as scanner:
                (message,) = await _first_inserts(scanner, 1)
            assert (message.message_id, message.payload) == (landed, b"b")
    finally:
        await wal.aclose()


async def test_a_tailing_reader_open_at_the_loss_gets_the_landed_message(
    scheme: str, chain: str
) -> None:
    wal = await _open(scheme, chain)
    try:
        await wal.append(Message(payload=b"a", vchannel="v"))
        async with wal.read(DeliverPolicy.latest()) as scanner:
            await _append_losing_the_ack(wal, b"b")
            after = await wal.append(Message(payload=b"c", vchannel="v"))
            got = await _first_inserts(scanner, 2)
        assert [m.payload for m in got] == [b"b", b"c"]
        assert got[-1].message_id == after.message_id
        # A reader opened later, from the landed message, once the first has closed.
        async with wal.read(DeliverPolicy.start_from(got[0].message_id)) as scanner:
            assert [m.payload for m in await _first_inserts(scanner, 2)] == [b"b", b"c"]
    finally:
        await wal.aclose()


async def test_a_latest_reader_after_the_loss_starts_after_the_landed_message(
    scheme: str, chain: str
) -> None:
    wal = await _open(scheme, chain)
    try:
        await wal.append(Message(payload=b"a", vchannel="v"))
        await _append_losing_the_ack(wal, b"b")
        async with wal.read(DeliverPolicy.latest()) as scanner:
            await asyncio.sleep(0.05)  # the reader is positioned before the next append
            await wal.append(Message(payload=b"c", vchannel="v"))
            assert [m.payload for m in await _first_inserts(scanner, 1)] == [b"c"]
    finally:
        await wal.aclose()
