"""A durable subscription keeps the filter it reads with (issue 21, section 1).

Its checkpoint is a position among the messages of its own vchannels and types: "billing"
acknowledged on vchannel A up to tick T, then read on vchannel B, used to skip every B
message older than T without a word. The scope (vchannels and types) is stored with the
checkpoint, and a scanner asking for another one gets ``SubscriptionMismatch``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

import walsvc
from walsvc import Filter, Message, MessageType, SubscriptionBusy, SubscriptionMismatch, WALClosed
from walsvc.backends._subscriptions import StoredSubscription, SubscriptionScope


async def _append(wal: walsvc.WAL, vchannel: str, count: int) -> None:
    await wal.append_many(
        Message(payload=f"{vchannel}{i}".encode(), vchannel=vchannel) for i in range(count)
    )


async def _read_acking(
    wal: walsvc.WAL, name: str, filters: list[Filter], count: int
) -> list[bytes]:
    """Read ``count`` messages with subscription ``name``, acknowledging each."""
    got = []
    async with wal.read(filters=filters, subscription=name) as scanner:
        async for message in scanner:
            got.append(message.payload)
            await scanner.ack(message)
            if len(got) == count:
                break
    return got


async def test_a_subscription_read_with_another_vchannel_is_refused(url: str) -> None:
    async with await walsvc.open_wal(url, "p") as wal:
        await _append(wal, "b", 3)
        await _append(wal, "a", 3)
        only_a, only_b = [Filter(vchannels=["a"])], [Filter(vchannels=["b"])]
        assert await _read_acking(wal, "billing", only_a, 3) == [b"a0", b"a1", b"a2"]
        scanner = wal.read(filters=only_b, subscription="billing")
        with pytest.raises(SubscriptionMismatch) as refused:
            await scanner.__anext__()
        assert "vchannels ['a']" in str(refused.value)
        assert "vchannels ['b']" in str(refused.value)
        assert "delete_subscription" in str(refused.value)
        await scanner.aclose()
        # Refused, the name is free again and still where it was on vchannel a.
        await _append(wal, "a", 1)
        assert await _read_acking(wal, "billing", only_a, 1) == [b"a0"]


async def test_a_subscription_read_with_other_types_is_refused(url: str) -> None:
    async with await walsvc.open_wal(url, "p") as wal:
        await _append(wal, "a", 2)
        inserts = [Filter(types=[MessageType.INSERT])]
        assert len(await _read_acking(wal, "s", inserts, 2)) == 2
        with pytest.raises(SubscriptionMismatch, match=r"types \(any\)"):
            async with wal.read(subscription="s") as scanner:
                await scanner.__anext__()


async def test_the_same_scope_written_another_way_resumes(url: str) -> None:
    async with await walsvc.open_wal(url, "p") as wal:
        await _append(wal, "a", 2)
        await _append(wal, "b", 2)
        first = [Filter(vchannels=["a", "b"], types=[MessageType.INSERT, MessageType.DELETE])]
        assert await _read_acking(wal, "s", first, 2) == [b"a0", b"a1"]
        # The same sets, in another order, and a min_timetick (not part of the scope).
        same = [
            Filter(
                vchannels=["b", "a"], types=[MessageType.DELETE, MessageType.INSERT], min_timetick=1
            )
        ]
        assert await _read_acking(wal, "s", same, 2) == [b"b0", b"b1"]


async def test_delete_subscription_starts_the_name_again(url: str) -> None:
    async with await walsvc.open_wal(url, "p") as wal:
        await _append(wal, "a", 2)
        await _append(wal, "b", 2)
        assert await _read_acking(wal, "s", [Filter(vchannels=["a"])], 2) == [b"a0", b"a1"]
        async with wal.read(subscription="s"):
            with pytest.raises(SubscriptionBusy):
                await wal.delete_subscription("s")
        await wal.delete_subscription("s")
        await wal.delete_subscription("s")  # nothing stored: nothing to do
        assert await wal.backend.subscriptions().load("s") is None
        assert await _read_acking(wal, "s", [Filter(vchannels=["b"])], 2) == [b"b0", b"b1"]
    with pytest.raises(WALClosed):
        await wal.delete_subscription("s")


async def test_a_checkpoint_stored_without_a_scope_resumes_and_takes_the_scanners(
    tmp_path: Path,
) -> None:
    """A version-1 file (walsvc before scopes were kept) reads, whatever the filter, and
    the next write records the scope of the scanner that writes it."""
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p") as wal:
        await _append(wal, "a", 2)
        async with wal.read(filters=[Filter(vchannels=["a"])], timeticks=False) as scanner:
            first = await scanner.__anext__()
        await _append(wal, "a", 1)
    body = first.checkpoint.marshal().encode("ascii")
    tail = struct.pack("<BI", 1, len(body)) + body
    path = tmp_path / "p" / "subscriptions" / "old"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"WSUB" + crc32c(tail).to_bytes(4, "little") + tail)
    async with await walsvc.open_wal(url, "p") as wal:
        store = wal.backend.subscriptions()
        assert await store.load_stored("old") == StoredSubscription(first.checkpoint, None)
        only_a = [Filter(vchannels=["a"])]
        # After a0: a1, then the a0 of the second append.
        assert await _read_acking(wal, "old", only_a, 2) == [b"a1", b"a0"]
        stored = await store.load_stored("old")
        assert stored is not None
        assert stored.scope == SubscriptionScope.of(Filter.combine(only_a))
        with pytest.raises(SubscriptionMismatch):
            async with wal.read(subscription="old") as scanner:
                await scanner.__anext__()


async def test_a_subscription_without_a_checkpoint_takes_any_scope(url: str) -> None:
    async with await walsvc.open_wal(url, "p") as wal:
        await _append(wal, "a", 1)
        await _append(wal, "b", 1)
        async with wal.read(filters=[Filter(vchannels=["a"])], subscription="s") as scanner:
            await scanner.__anext__()  # delivered, never acknowledged: nothing stored
        assert await _read_acking(wal, "s", [Filter(vchannels=["b"])], 1) == [b"b0"]


async def test_a_node_subscription_is_scoped_to_its_vchannel(tmp_path: Path) -> None:
    """``node.read(v, subscription=...)``: the name is per pchannel, so two vchannels
    placed on one pchannel cannot share it by accident."""
    async with await walsvc.open_node(f"file://{tmp_path}", ["p0"]) as node:
        await node.append(Message(payload=b"x", vchannel="orders"))
        await node.append(Message(payload=b"y", vchannel="refunds"))
        async with node.read("orders", subscription="billing") as scanner:
            message = await scanner.__anext__()
            assert message.payload == b"x"
            await scanner.ack(message)
        with pytest.raises(SubscriptionMismatch, match="orders"):
            async with node.read("refunds", subscription="billing") as scanner:
                await scanner.__anext__()


def test_the_scope_describes_itself_briefly_and_digests_everything() -> None:
    many = Filter(vchannels=[f"vchannel-{i:04}" for i in range(500)])
    scope = SubscriptionScope.of(many)
    assert len(scope.description) <= 200
    assert scope.description.endswith("...")
    one_less = Filter(vchannels=[f"vchannel-{i:04}" for i in range(499)])
    assert SubscriptionScope.of(one_less).digest != scope.digest
    assert SubscriptionScope.of(Filter()).description == "vchannels (any), types (any)"
    assert SubscriptionScope.of(Filter(types=[MessageType.INSERT, 12345])).description == (
        "vchannels (any), types [INSERT, APPLICATION_12345]"
    )
