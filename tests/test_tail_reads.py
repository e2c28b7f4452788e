"""What tailing readers of a file WAL read (issue 21, section 4): bytes and head reads
per delivered message, counted (``os.pread`` wrapped by a counting shim, by file), never
timed.

A read-only WAL stands for the reader in another process: its scanners learn of appends
from the head file only. A writer in another process is modelled by a writer whose
appends do not signal this process's scanners (its directory gets an ``AppendSignal`` of
its own), so only the directory's poll of the head file can wake the reader.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import walsvc
from walsvc import DeliverPolicy, Message
from walsvc.backends._file import _directory
from walsvc.backends._file._directory import AppendSignal, TailWatch
from walsvc.backends._file._head import HeadState, _parse
from walsvc.backends._file._scanner import FileScanner

_PAYLOAD = bytes(range(100))
_MESSAGES = 30
_READERS = 20


class _Reads:
    """Counts ``os.pread`` calls and bytes per descriptor while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.calls: Counter[int] = Counter()
        self.bytes: Counter[int] = Counter()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Reads]:
    counted = _Reads()
    pread = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        data = pread(fd, size, offset)
        if counted.on:
            counted.calls[fd] += 1
            counted.bytes[fd] += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting)
    return counted


def _head_of(wal: walsvc.WAL) -> tuple[int, HeadState]:
    """The head file's descriptor of ``wal`` and what it says (read uncounted)."""
    fd: int = wal._backend.directory.head.fd  # type: ignore[attr-defined]
    with open(wal._backend.directory.head.path, "rb") as f:  # type: ignore[attr-defined]
        state = _parse(f.read())
    assert state is not None
    return fd, state


async def _bare(url: str, **options: object) -> walsvc.WAL:
    return await walsvc.open_wal(url, "p", interceptors=[], **options)


async def test_a_tailing_reader_of_another_process_reads_each_byte_once_and_the_head_once_per_poll(
    tmp_path: Path, reads: _Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paced appends (the reader has each message before the next append): the reader
    reads every frame's bytes once and the head file only in the directory's poll (one
    read per poll; before: the poll's, then two more per wakeup: on waking, and after the
    block to look for more), never delivering past the head's durable end."""
    polls = [0]
    poll = TailWatch._poll

    def counting_poll(self: TailWatch, *args: object) -> None:
        polls[0] += 1
        poll(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(TailWatch, "_poll", counting_poll)
    # A scanner back at the durable end it knows reads the head again only when the
    # read it used is older than FRESH: on a slow machine that may happen; here, never.
    monkeypatch.setattr(_directory, "FRESH", 3600.0, raising=False)
    url = f"file://{tmp_path}"
    async with await _bare(url, sync="none") as writer:
        writer._backend.directory.signal = AppendSignal()  # type: ignore[attr-defined]
        first = await writer.append(Message(payload=_PAYLOAD, vchannel="v"))
        async with (
            await _bare(url, read_only=True, poll_interval=0.002) as reader,
            reader.read(DeliverPolicy.start_after(first.message_id)) as tail,
        ):
            # The scanner's first read starts at the frame before its start: warm up.
            await writer.append(Message(payload=_PAYLOAD, vchannel="v"))
            await asyncio.wait_for(anext(tail), 10)
            head_fd, before = _head_of(reader)
            writer_head_fd, _ = _head_of(writer)
            reads.on = True
            polls[0] = 0
            watch = reader._backend.directory.watch  # type: ignore[attr-defined]
            for i in range(_MESSAGES):
                pending = asyncio.ensure_future(anext(tail))
                for _ in range(10_000):  # until the scanner waits at the end of the log
                    if watch.waiting:
                        break
                    await asyncio.sleep(0)
                sent = await writer.append(Message(payload=_PAYLOAD, vchannel="v"))
                got = await asyncio.wait_for(pending, 10)
                assert got.message_id == sent.message_id, i
                _, now = _head_of(reader)
                assert got.message_id.seq < now.durable_end  # type: ignore[attr-defined]
            reads.on = False
            _, after = _head_of(reader)
    assert after.end_segment == before.end_segment
    grown = after.end_offset - before.end_offset  # the frames of the messages delivered
    head_reads = reads.calls[head_fd]
    segment_bytes = sum(n for fd, n in reads.bytes.items() if fd not in (head_fd, writer_head_fd))
    assert segment_bytes == grown
    # Every head read is a poll's (those that found nothing new included).
    assert head_reads <= polls[0]
    per_payload = (segment_bytes + reads.bytes[head_fd]) / (_MESSAGES * len(_PAYLOAD))
    assert per_payload < 3.0, (segment_bytes, reads.bytes[head_fd])


async def test_readers_woken_by_one_append_read_the_head_and_the_bytes_once(
    tmp_path: Path, reads: _Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many tailing scanners of one read-only WAL, woken by an append of this process:
    one head read, one read of the new bytes and one decode serve all of them (before:
    two head reads, one read and one decode per scanner and append)."""
    decodes = [0]
    decode = FileScanner._decode

    def counting_decode(self: FileScanner, *args: object) -> object:
        decodes[0] += 1
        return decode(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(FileScanner, "_decode", counting_decode)
    url = f"file://{tmp_path}"
    async with await _bare(url, sync="none") as writer:
        first = await writer.append(Message(payload=_PAYLOAD, vchannel="v"))
        async with await _bare(url, read_only=True, poll_interval=60) as reader:
            head_fd, _ = _head_of(reader)
            writer_head_fd, _ = _head_of(writer)
            scanners = [
                reader.read(DeliverPolicy.start_after(first.message_id)) for _ in range(_READERS)
            ]
            pending = [asyncio.ensure_future(anext(s)) for s in scanners]
            await asyncio.sleep(0.05)  # every scanner waits at the end of the log
            assert not any(p.done() for p in pending)
            reads.on = True
            decodes[0] = 0
            for i in range(_MESSAGES):
                sent = await writer.append(Message(payload=b"%d" % i, vchannel="v"))
                got = await asyncio.wait_for(asyncio.gather(*pending), 10)
                assert {m.message_id for m in got} == {sent.message_id}
                pending = [asyncio.ensure_future(anext(s)) for s in scanners]
            reads.on = False
            for p in pending:
                p.cancel()
            for scanner in scanners:
                await scanner.aclose()
    segment_reads = sum(n for fd, n in reads.calls.items() if fd not in (head_fd, writer_head_fd))
    # One read of the head per append (a second when a scanner comes back to the head
    # more than FRESH after the first read), one of the new bytes and one decode.
    assert reads.calls[head_fd] <= 2 * _MESSAGES
    assert segment_reads <= _MESSAGES + 1
    assert decodes[0] <= _MESSAGES + 1
