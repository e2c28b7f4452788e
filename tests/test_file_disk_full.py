"""A ``file://`` writer on a disk that fills up and frees again: it appends again once
there is room, without a reopen, on its own and behind a node.

Before, the first I/O error failed the writer for good ("reopen the WAL to recover"): an
embedded user had to reopen, and a node's pchannel took no append until the node was
restarted, since clients cannot reopen the node's WAL. Now the batch the error hit fails
with ``AppendOutcomeUnknown`` and the next append first cuts the log back to the head's
durable end. A small tmpfs filled to the last byte where the machine allows mounting one
(else ``ENOSPC`` injected at the writer's Python-level writes, the commit thread off).
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _full_disk import fill, small_filesystem
from _node_process import node_process

import walsvc
import walsvc.backends._file._writer as file_writer
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.apps._cli import main as cli

PAYLOAD = b"x" * 2000


@contextmanager
def full_disk(root: Path, mounted: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The disk under ``root`` is full inside, has room again after."""
    if mounted:
        ballast = fill(root)
        try:
            yield
        finally:
            ballast.unlink()
    else:
        with monkeypatch.context() as patch:
            patch.setattr(file_writer.os, "pwrite", _no_space)
            yield


def _no_space(*args: object) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def _keyed(wal: walsvc.WAL, key: str) -> walsvc.AppendResult | walsvc.WALError:
    """The outcome of one keyed append: its result, or the WALError it raised."""
    try:
        return await wal.append(Message(payload=PAYLOAD, vchannel="v", idempotency_key=key))
    except walsvc.WALError as exc:
        return exc


#: What an append on a full disk may raise: its batch hit the error (may have landed), or
#: the cut back to the durable end failed too (nothing written).
FULL_DISK_ERRORS = (walsvc.AppendOutcomeUnknown, walsvc.BackendUnavailable)


async def _append_until_it_fails(wal: walsvc.WAL, prefix: str) -> tuple[list[str], list[str]]:
    """Keyed appends until one fails: (keys acknowledged, keys whose append failed)."""
    acked: list[str] = []
    for i in range(10_000):
        key = f"{prefix}{i}"
        outcome = await _keyed(wal, key)
        if isinstance(outcome, walsvc.WALError):
            assert isinstance(outcome, FULL_DISK_ERRORS), outcome
            return acked, [key]
        acked.append(key)
    raise AssertionError("the disk never filled")


async def _inserts(url: str) -> list[walsvc.ImmutableMessage]:
    """The INSERTs of pchannel "p" up to its newest message, by a fresh read-only open."""
    async with await walsvc.open_wal(url, "p", read_only=True) as reader:
        latest = await reader.latest_message_id()
        assert latest is not None
        out = []
        async with reader.read(DeliverPolicy.all(), raw=True) as scanner:
            async for message in scanner:
                if message.type is MessageType.INSERT:
                    out.append(message)
                if not message.message_id < latest:
                    break
    return out


@pytest.mark.parametrize("sync", ["always", "none"])
async def test_a_writer_appends_again_once_the_disk_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    root = tmp_path / "disk"
    url = f"file://{root}"
    with small_filesystem(root) as mounted:
        if not mounted:
            monkeypatch.setattr(file_writer, "_ccommit", None)  # every write in Python
        async with await walsvc.open_wal(url, "p", sync=sync, segment_size=256 * 1024) as wal:
            first = await wal.append(Message(payload=PAYLOAD, vchannel="v", idempotency_key="a"))
            with full_disk(root, mounted, monkeypatch):
                acked, failed = await _append_until_it_fails(wal, "b")
                # more attempts on the full disk: each fails or lands (a cut back to the
                # durable end frees the runway the failed batch had), never twice
                landed = None
                for _ in range(3):
                    outcome = await _keyed(wal, failed[0])
                    if isinstance(outcome, walsvc.WALError):
                        assert landed is None, outcome
                        assert isinstance(outcome, FULL_DISK_ERRORS), outcome
                    else:
                        landed = outcome
            # room again: the same WAL takes the failed key (once) and new ones
            retried = await wal.append(
                Message(payload=PAYLOAD, vchannel="v", idempotency_key=failed[0])
            )
            assert landed in (None, retried)
            after = await wal.append(Message(payload=PAYLOAD, vchannel="v", idempotency_key="c"))
            assert first.message_id < retried.message_id < after.message_id
        inserts = await _inserts(url)
        # Nothing of the failed batches is left after the durable end to trouble an open
        # (which refuses frames after a damaged one) or a check.
        async with await walsvc.open_wal(url, "p"):
            pass
        assert await asyncio.to_thread(cli, ["check", url, "p"]) == 0
    keys = [m.idempotency_key for m in inserts]
    assert keys == ["a", *acked, failed[0], "c"]  # every acknowledged key once, in order
    ids = [m.message_id for m in inserts]
    assert ids == sorted(set(ids))
    assert inserts[0].message_id == first.message_id
    assert inserts[-1].message_id == after.message_id


async def test_a_node_takes_appends_again_once_its_disk_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node process over a ``file://`` log on a disk that fills up: its clients'
    appends fail while it is full and land once it has room, through the same node and
    WAL. (Where no file system can be mounted, the node runs in this process, with the
    fault injected.)"""
    root = tmp_path / "disk"
    with small_filesystem(root) as mounted:
        if mounted:
            with node_process(f"file://{root}", "--sync", "always") as (node_url, _):
                acked, failed = await _through_node(node_url, root, mounted, monkeypatch)
        else:
            monkeypatch.setattr(file_writer, "_ccommit", None)
            async with walsvc.serve(f"file://{root}", "127.0.0.1:0") as node:
                acked, failed = await _through_node(node.url, root, mounted, monkeypatch)
        inserts = await _inserts(f"file://{root}")
    payloads = [m.payload for m in inserts]
    assert payloads == [PAYLOAD + key.encode() for key in ["a", *acked, *failed, "c"]]


async def _through_node(
    node_url: str, root: Path, mounted: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[str]]:
    """Appends through a node (payload: PAYLOAD + key, producer keys by the client):
    "a", then until the disk is full, then, with room again, the failed one and "c"."""
    async with await walsvc.open_wal(node_url, "p") as wal:

        async def append(key: str) -> walsvc.AppendResult:
            async with asyncio.timeout(30):
                return await wal.append(Message(payload=PAYLOAD + key.encode(), vchannel="v"))

        await append("a")
        acked: list[str] = []
        with full_disk(root, mounted, monkeypatch):
            for i in range(10_000):
                try:
                    await append(f"b{i}")
                except walsvc.WALError:
                    failed = [f"b{i}"]
                    break
                acked.append(f"b{i}")
            else:
                raise AssertionError("the disk never filled")
        # The failed append was not written (the node cut the log back before the next
        # write), so sent again it lands once; then a new one.
        await append(failed[0])
        await append("c")
    return acked, failed


@pytest.mark.parametrize("fails", ["segment", "head"])
async def test_a_segment_roll_or_head_write_that_failed_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """The first write to a new segment fails: the cut removes that segment and goes
    back to the one the head names, and the next batch rolls again. Or a head write
    fails after its batch's frames were synced: they are not acknowledged, and the cut
    drops them."""
    monkeypatch.setattr(file_writer, "_ccommit", None)
    real_pwrite = os.pwrite
    armed = False

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        nonlocal armed
        # at 0: a new segment's first frame, or the 60-byte head
        if armed and offset == 0 and (len(data) > 60) == (fails == "segment"):
            armed = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p", sync="always", segment_size=16 * 1024) as wal:
        acked = [await _keyed(wal, "k0")]
        monkeypatch.setattr(file_writer.os, "pwrite", pwrite)
        armed = True
        failures = 0
        for i in range(1, 40):
            outcome = await _keyed(wal, f"k{i}")
            while isinstance(outcome, walsvc.WALError):  # the same key again, on the same WAL
                assert isinstance(outcome, FULL_DISK_ERRORS), outcome
                failures += 1
                outcome = await _keyed(wal, f"k{i}")
            acked.append(outcome)
        assert failures == 1
        assert not armed
    inserts = await _inserts(url)
    assert [m.idempotency_key for m in inserts] == [f"k{i}" for i in range(40)]
    assert [m.message_id for m in inserts] == [r.message_id for r in acked]
    async with await walsvc.open_wal(url, "p"):
        pass
    assert await asyncio.to_thread(cli, ["check", url, "p"]) == 0


async def test_a_writer_fenced_while_broken_stays_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error, then a newer writer opens the pchannel: the cut finds the newer term
    and the old writer is fenced for good, its log untouched by it."""
    monkeypatch.setattr(file_writer, "_ccommit", None)
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p", interceptors=[]) as old:
        kept = await old.append(Message(payload=PAYLOAD, vchannel="v"))
        with monkeypatch.context() as patch:
            patch.setattr(file_writer.os, "pwrite", _no_space)
            with pytest.raises(walsvc.AppendOutcomeUnknown):
                await old.append(Message(payload=PAYLOAD, vchannel="v"))
        async with await walsvc.open_wal(url, "p", interceptors=[]) as new:
            landed = await new.append(Message(payload=b"new", vchannel="v"))
            for _ in range(2):
                with pytest.raises(walsvc.WALFenced):
                    await old.append(Message(payload=PAYLOAD, vchannel="v"))
    inserts = await _inserts(url)
    assert [m.message_id for m in inserts] == [kept.message_id, landed.message_id]
