"""The storage half of durable subscriptions: ``SubscriptionStore`` on ``memory://`` and
``file://`` (round trips, persistence across reopen, names, claims, the file store's files,
damaged files, a full disk and a killed save). The throttled writer on top of a store is
``test_checkpoint_writer.py``'s.

The file store runs on real files (a full disk is a small tmpfs where the machine allows
mounting one); the injected faults are a failing ``os.replace`` and, where no tmpfs can
be mounted, ``ENOSPC``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from _full_disk import fill, small_filesystem
from _store_support import checkpoint_at, fail_replace_once, saved_file, store_round_trip

import walsvc
from walsvc import (
    BackendUnavailable,
    Checkpoint,
    CorruptRecord,
    InvalidArgument,
    Message,
)
from walsvc.backends import Backend
from walsvc.backends._file._subscriptions import FileSubscriptionStore
from walsvc.backends._memory import MemorySubscriptionStore
from walsvc.core._errors import SubscriptionBusy
from walsvc.read._checkpoints import CheckpointWriter

INVALID_NAMES = ["", "-a", ".a", "_a", "a/b", "../a", "a b", "a\n", "é", "a" * 201, "a:b"]
VALID_NAMES = ["a", "0", "a" * 200, "Sub-1.two_3", "x.tmp"]


@pytest.fixture
async def wal(url: str) -> AsyncIterator[walsvc.WAL]:
    async with await walsvc.open_wal(url, "p") as wal:
        yield wal


def _file_store(root: Path, pchannel: str = "p") -> FileSubscriptionStore:
    return FileSubscriptionStore(str(root / pchannel))


# ---------------------------------------------------------------------------------------
# The stores


async def test_round_trip_names_and_delete(wal: walsvc.WAL) -> None:
    store = wal.backend.subscriptions()
    assert store is wal.backend.subscriptions(), "one store per backend"
    first = await wal.append(Message(payload=b"1", vchannel="v"))
    second = await wal.append(Message(payload=b"2", vchannel="v"))
    await store_round_trip(store, first.message_id, second.message_id)


async def test_listed_gives_the_first_by_name_and_counts_the_rest(wal: walsvc.WAL) -> None:
    store = wal.backend.subscriptions()
    assert await store.listed() == ([], 0)
    for name, tick in (("c", 3), ("a", 1), ("b", 2)):
        await store.save(name, checkpoint_at(tick))
    everything, more = await store.listed()
    assert [(n, s.checkpoint.timetick) for n, s in everything] == [("a", 1), ("b", 2), ("c", 3)]
    assert more == 0
    first, more = await store.listed(2)
    assert ([n for n, _ in first], more) == (["a", "b"], 1)
    await store.delete("b")
    assert [n for n, _ in (await store.listed())[0]] == ["a", "c"]


async def test_checkpoints_survive_reopening_the_wal(url: str) -> None:
    async with await walsvc.open_wal(url, "p") as wal:
        result = await wal.append(Message(payload=b"x", vchannel="v"))
        checkpoint = Checkpoint(result.last_confirmed_id, result.timetick)
        await wal.backend.subscriptions().save("reader", checkpoint)
        await wal.backend.subscriptions().save("gone", checkpoint)
        await wal.backend.subscriptions().delete("gone")
    for read_only in (False, True):
        async with await walsvc.open_wal(url, "p", read_only=read_only) as wal:
            store = wal.backend.subscriptions()
            assert await store.load("reader") == checkpoint
            assert await store.load("gone") is None
            assert await store.names() == ["reader"]
    async with await walsvc.open_wal(url, "other") as wal:
        assert await wal.backend.subscriptions().names() == [], "pchannels share nothing"


async def test_a_read_only_file_wal_can_save_checkpoints(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p") as wal:
        await wal.append(Message(payload=b"x", vchannel="v"))
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        await wal.backend.subscriptions().save("reader", Checkpoint(None, 3))
    async with await walsvc.open_wal(url, "p", read_only=True) as wal:
        assert await wal.backend.subscriptions().load("reader") == Checkpoint(None, 3)
    assert (tmp_path / "p" / "subscriptions" / "reader").is_file()


@pytest.mark.parametrize("name", INVALID_NAMES)
async def test_invalid_names_are_refused(wal: walsvc.WAL, name: str) -> None:
    store = wal.backend.subscriptions()
    with pytest.raises(InvalidArgument, match="subscription name"):
        await store.load(name)
    with pytest.raises(InvalidArgument, match="subscription name"):
        await store.save(name, checkpoint_at(1))
    with pytest.raises(InvalidArgument, match="subscription name"):
        await store.delete(name)
    with pytest.raises(InvalidArgument, match="subscription name"):
        store.claim(name)
    with pytest.raises(InvalidArgument, match="subscription name"):
        store.release(name)
    with pytest.raises(InvalidArgument, match="subscription name"):
        CheckpointWriter(store, name)
    assert await store.names() == []


async def test_valid_names_round_trip(wal: walsvc.WAL) -> None:
    store = wal.backend.subscriptions()
    for i, name in enumerate(VALID_NAMES):
        await store.save(name, checkpoint_at(i))
    for i, name in enumerate(VALID_NAMES):
        assert await store.load(name) == checkpoint_at(i)
    assert await store.names() == sorted(VALID_NAMES)


async def test_claims_are_shared_by_every_store_of_the_same_pchannel(url: str) -> None:
    async with (
        await walsvc.open_wal(url, "p") as writer,
        await walsvc.open_wal(url, "p", read_only=True) as reader,
        await walsvc.open_wal(url, "q") as other,
    ):
        mine, theirs = writer.backend.subscriptions(), reader.backend.subscriptions()
        assert mine is not theirs
        mine.claim("s")
        with pytest.raises(SubscriptionBusy):
            theirs.claim("s")
        with pytest.raises(SubscriptionBusy):
            mine.claim("s")
        theirs.claim("t")  # other names are free
        other.backend.subscriptions().claim("s")  # other pchannels too
        theirs.release("s")
        mine.claim("s")  # free again
        mine.release("s")
        mine.release("s")  # releasing an unclaimed name does nothing
        for store in (mine, theirs, other.backend.subscriptions()):
            store.release("t")
            store.release("s")
            store.claim("s")
            store.release("s")


def test_claims_are_keyed_by_location_and_pchannel(tmp_path: Path) -> None:
    name = uuid.uuid4().hex
    first, again = MemorySubscriptionStore(name, "p"), MemorySubscriptionStore(name, "p")
    first.claim("s")
    with pytest.raises(SubscriptionBusy):
        again.claim("s")
    MemorySubscriptionStore(uuid.uuid4().hex, "p").claim("s")
    MemorySubscriptionStore(name, "p2").claim("s")
    (tmp_path / "p").mkdir()
    _file_store(tmp_path).claim("s")  # file stores never share with memory ones
    with pytest.raises(SubscriptionBusy):
        FileSubscriptionStore(f"{tmp_path}/./p").claim("s")  # the same directory
    for store in (
        first,
        MemorySubscriptionStore(name, "p2"),
        _file_store(tmp_path),
    ):
        store.release("s")


_HOLD_A_CLAIM = """
import asyncio, sys, walsvc
async def main():
    async with await walsvc.open_wal(sys.argv[1], "p", read_only=True) as wal:
        async with wal.read(subscription="s"):
            print("claimed", flush=True)
            await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_a_file_subscription_read_in_another_process_is_busy(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p") as wal:
        await wal.append(Message(payload=b"x", vchannel="v"))
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLD_A_CLAIM, url, stdout=asyncio.subprocess.PIPE
        )
        try:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line == b"claimed\n"
            with pytest.raises(SubscriptionBusy, match=f"another process \\(pid {child.pid};"):
                wal.read(subscription="s")
            async with wal.read(subscription="t"):  # other names are free
                pass
        finally:
            child.kill()
            await child.wait()
        # The kernel dropped the dead process's lock.
        async with wal.read(subscription="s") as scanner:
            async for message in scanner:
                if message.vchannel == "v":
                    assert message.payload == b"x"
                    break


async def test_the_base_backend_has_no_subscriptions(wal: walsvc.WAL) -> None:
    with pytest.raises(InvalidArgument, match=r"WALs have no durable subscriptions"):
        Backend.subscriptions(wal.backend)


# ---------------------------------------------------------------------------------------
# The file store's files


async def test_the_file_holds_a_checksummed_checkpoint(tmp_path: Path) -> None:
    _, path = await saved_file(tmp_path, checkpoint_at(42))
    data = path.read_bytes()
    assert data.startswith(b"WSUB")
    assert data.endswith(b"42@\n\n"), "version 2: the checkpoint, then no scope"
    assert [p.name for p in path.parent.iterdir()] == ["s"], "no temporary file left"


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"", id="empty"),
        pytest.param(lambda data: data[:5], id="inside-header"),
        pytest.param(lambda data: data[:-1], id="truncated-body"),
        pytest.param(lambda data: data + b"\0", id="trailing-byte"),
        pytest.param(lambda data: data[:-2] + b"9" + data[-1:], id="flipped-body"),
        pytest.param(lambda data: b"X" + data[1:], id="bad-magic"),
        pytest.param(lambda data: data[:8] + b"\x09" + data[9:], id="bad-version"),
        pytest.param(lambda data: b"12345@file:3", id="plain-text"),
        pytest.param(lambda data: bytes(range(256)) * 64, id="large-garbage"),
    ],
)
async def test_a_damaged_file_raises_corrupt_record_naming_it(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    store, path = await saved_file(tmp_path, Checkpoint(None, 12345))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptRecord) as caught:
        await store.load("s")
    assert str(path) in str(caught.value)
    async with await walsvc.open_wal(f"file://{tmp_path}", "p", read_only=True) as wal:
        with pytest.raises(CorruptRecord):
            await wal.backend.subscriptions().load("s")
    await store.save("s", checkpoint_at(1))  # a save replaces a damaged file
    assert await store.load("s") == checkpoint_at(1)


async def test_names_ignore_temporary_and_foreign_entries(tmp_path: Path) -> None:
    store, path = await saved_file(tmp_path, checkpoint_at(1))
    (path.parent / ".s.0123456789abcdef.tmp").write_bytes(b"left by a crash")
    (path.parent / "a-directory").mkdir()
    assert await store.names() == ["s"]
    assert await store.load("s") == checkpoint_at(1)


async def test_a_failed_save_keeps_the_previous_file_and_raises_backend_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path = await saved_file(tmp_path, checkpoint_at(1))
    fail_replace_once(monkeypatch)
    with pytest.raises(BackendUnavailable, match="cannot write checkpoint file") as caught:
        await store.save("s", checkpoint_at(2))
    assert isinstance(caught.value.__cause__, OSError)
    assert await store.load("s") == checkpoint_at(1)
    assert sorted(p.name for p in path.parent.iterdir()) == ["s"], "temporary file removed"
    await store.save("s", checkpoint_at(2))
    assert await store.load("s") == checkpoint_at(2)


async def test_concurrent_saves_of_one_name_leave_one_whole_checkpoint(tmp_path: Path) -> None:
    store, path = await saved_file(tmp_path, checkpoint_at(0))
    twin = _file_store(tmp_path)
    saves = [(store if i % 2 else twin).save("s", checkpoint_at(i)) for i in range(1, 41)]
    await asyncio.gather(*saves)
    assert (await store.load("s")) in {checkpoint_at(i) for i in range(1, 41)}
    assert sorted(p.name for p in path.parent.iterdir()) == ["s"]


# ---------------------------------------------------------------------------------------
# Faults: a full disk, a killed save


async def test_a_claim_on_a_full_disk_is_typed_and_leaves_the_name_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a raw OSError, and the name stayed busy (the lock's descriptor leaked with
    its flock) until the process exited. Now the claim either holds (the pid note in the
    lock file is best effort) or fails with a WALError; either way, once released or
    failed, the name can be claimed again."""
    root = tmp_path / "disk"
    url = f"file://{root}"
    with small_filesystem(root) as mounted:
        async with await walsvc.open_wal(url, "p") as wal:
            await wal.append(Message(payload=b"x", vchannel="v"))
            store = wal.backend.subscriptions()
            store.claim("warm")  # the directory exists before the disk is full
            store.release("warm")
            if mounted:
                ballast = fill(root)
            else:  # this machine cannot mount a small file system: the same fault, injected
                monkeypatch.setattr(os, "pwrite", _no_space)
            for _ in range(3):
                try:
                    store.claim("s")
                except walsvc.SubscriptionBusy:
                    raise
                except walsvc.WALError:
                    pass
                else:
                    store.release("s")
            with pytest.raises(walsvc.WALError) as saved:
                await store.save("s", Checkpoint(None, 1))
            assert saved.value.retriable  # a full disk may free up
            if mounted:
                ballast.unlink()
            else:
                monkeypatch.undo()
            store.claim("s")
            await store.save("s", Checkpoint(None, 1))
            store.release("s")


def _no_space(*args: object) -> int:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_a_killed_save_leaves_no_temporary_files(tmp_path: Path) -> None:
    """A save killed between writing its temporary file and renaming it left
    ``subscriptions/.<name>.<random>.tmp`` forever; the writer's open (and a claim of
    the name) removes what no live scanner can be writing. A name claimed now keeps its."""
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p") as wal:
        await wal.backend.subscriptions().save("a", Checkpoint(None, 1))
    directory = tmp_path / "p" / "subscriptions"

    def leave(*names: str) -> None:
        for name in names:
            for i in (1, 2):
                (directory / f".{name}.{i:016x}.tmp").write_bytes(b"half a checkpoint")

    async with await walsvc.open_wal(url, "p", read_only=True) as reader:
        reader.backend.subscriptions().claim("b")
        leave("a", "b", "x.tmp")  # b's: its live holder may be saving right now
        async with await walsvc.open_wal(url, "p") as wal:
            assert sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp")) == [
                ".b.0000000000000001.tmp",
                ".b.0000000000000002.tmp",
            ]
            assert await wal.backend.subscriptions().load("a") == Checkpoint(None, 1)
        reader.backend.subscriptions().release("b")
        leave("b")
        reader.backend.subscriptions().claim("b")  # a new holder of the name clears it
        assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
        reader.backend.subscriptions().release("b")
