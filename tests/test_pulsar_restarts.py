"""The ``pulsar://`` backend across a broker stopped and restarted mid-stream (Pulsar
Lite on the same port and data directory; see _pulsar_lite.py): appends during the
outage fail, retried keys land once after it, and a reader resumes from a checkpoint
without a gap. Each test has a broker of its own (``own_broker``)."""

from __future__ import annotations

import asyncio

from _pulsar_lite import HANG, PulsarLite, data, own_broker, pchannel, read_labels, take_data

import walsvc
from walsvc import DeliverPolicy, Message
from walsvc.backends._pulsar import PulsarMessageId

# Fixtures imported from the helper module (pytest finds them by name here).
__all__ = ("own_broker",)


async def test_broker_restart_mid_stream(own_broker: PulsarLite) -> None:
    """Appends during the outage fail (typed, or by the caller's deadline); after the
    restart every key is retried until it succeeds, reopening the WAL when dedup blocked
    a key whose cancelled append it could not resolve. Every acked message is read back
    once, in id order, and a retried key answers its original id. The outage (five
    appends, each given 0.5 s) lasts about as long as ``operation_timeout`` (2.5 s), so the
    send of the first group in flight times out about when the broker comes back."""
    pch = pchannel()
    url = own_broker.url
    wals = [await walsvc.open_wal(url, pch, operation_timeout=2.5)]
    acked: dict[str, PulsarMessageId] = {}
    outage_outcomes: list[str] = []

    async def append(i: int, deadline: float) -> str:
        message = Message(
            payload=f"m:{i}".encode(),
            vchannel="v",
            properties={"n": f"m:{i}"},
            idempotency_key=walsvc.producer_key("test", i),
        )
        try:
            async with asyncio.timeout(deadline):
                result = await wals[-1].append(message)
        except (walsvc.BackendUnavailable, walsvc.AppendOutcomeUnknown, TimeoutError) as exc:
            return type(exc).__name__
        assert isinstance(result.message_id, PulsarMessageId)
        assert acked.setdefault(f"m:{i}", result.message_id) == result.message_id
        return "ok"

    try:
        for i in range(20):
            assert await append(i, HANG) == "ok"
        own_broker.stop()
        outage_outcomes = [await append(i, 0.5) for i in range(20, 25)]
        own_broker.start()
        for i in [*range(20, 25), 0, 5, 19]:
            async with asyncio.timeout(HANG):
                while (outcome := await append(i, 10.0)) != "ok":
                    if outcome == "AppendOutcomeUnknown":  # the key is blocked: reopen
                        await wals[-1].aclose()
                        wals.append(await walsvc.open_wal(url, pch, operation_timeout=2.5))
                    await asyncio.sleep(0.05)
        for i in range(25, 35):
            assert await append(i, HANG) == "ok"
    finally:
        for wal in wals:
            await wal.aclose()
    assert "ok" not in outage_outcomes
    expected = [label for label, _ in sorted(acked.items(), key=lambda item: item[1])]
    assert len(expected) == 35
    assert await read_labels(url, pch, DeliverPolicy.all(), 35) == expected


async def test_reader_resumes_from_a_checkpoint_without_gap(own_broker: PulsarLite) -> None:
    pch = pchannel()
    async with await walsvc.open_wal(own_broker.url, pch) as wal:
        for i in range(30):
            await wal.append(data("c", i))
        async with wal.read(DeliverPolicy.all()) as scanner:
            first = [m async for m in take_data(scanner, 12)]
        checkpoint = first[-1].checkpoint
        own_broker.restart()
        for i in range(30, 40):
            async with asyncio.timeout(HANG):
                while True:
                    try:
                        await wal.append(data("c", i))
                        break
                    except walsvc.BackendUnavailable:
                        await asyncio.sleep(0.1)
    async with await walsvc.open_wal(own_broker.url, pch, read_only=True) as reader:
        async with reader.read(DeliverPolicy.from_checkpoint(checkpoint)) as scanner:
            rest = [m async for m in take_data(scanner, 28)]
    labels = [m.properties["n"] for m in first + rest]
    assert labels == [f"c:{i}" for i in range(40)]
