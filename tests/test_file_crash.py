"""Crash test of the ``file://`` backend: a child process appends with ``sync="always"``
from concurrent producers and reports every acknowledgement; the test kills it with
SIGKILL at a random moment (after a random number of acks, at a random time, or while it
opens and recovers the log), then checks the log it left, over and over on one directory.

A killed process leaves whole writes behind (the page cache survives it), so in some rounds
the test also plays a machine crash on top: it drops what was written after the durable
end the head file published, and leaves a torn last write (a prefix of a frame, a frame
zeroed from some point on, or zeros), which recovery must cut.

After every kill:

- read-only, before any recovery, and read-write, after recovery: every acknowledged
  message is present at its acknowledged id with its timetick and is intact; every message
  present is complete and is exactly what some producer wrote; ids are dense; timeticks
  strictly increase in log order; per producer the messages present are a gap-free prefix
  of what it appended, ending at most one in-flight batch past its last ack; what was
  verified in earlier rounds is unchanged; truncation took effect exactly as far as the
  child got with it;
- the read-only view is a prefix of the recovered one;
- appending works: the id continues the log and the timetick is above every earlier one.

One round also runs a reader process, read-only, through the crash and the recovery: it
only ever sees acknowledged-durable messages, all of which survive recovery, and it keeps
tailing across the recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from _crash_child import PARENT, PCHANNEL, check_message, expected_message

import walsvc
from walsvc import CorruptRecord, DeliverPolicy, ImmutableMessage
from walsvc.backends._file import FileMessageId
from walsvc.backends._file._format import (
    FRAME_HEADER_SIZE,
    encode_frames,
    parse_frame_header,
    verify_frame,
)
from walsvc.core._encode import encode


def open_bare(*args: Any, **kwargs: Any) -> Awaitable[walsvc.WAL]:
    """A bare WAL (no interceptors): the log holds exactly what the test appends, with no
    TimeTicks, because these tests are about the backend underneath."""
    kwargs.setdefault("interceptors", [])
    return walsvc.open_wal(*args, **kwargs)


CHILD = Path(__file__).with_name("_crash_child.py")
ROUNDS = 24 * int(os.environ.get("WALSVC_SOAK", "1"))  # make soak: more
READER_ROUND = 11
PRODUCERS = 8
SEGMENT_SIZE = 64 * 1024
#: Past this many retained messages, truncate (keeps each round's full read cheap).
RETAIN = 2500
Key = tuple[int, int, int]  # (round, producer, seq)


class Child:
    """A ``_crash_child.py`` process; a thread collects its stdout lines as they come."""

    def __init__(self, *args: object, stdin: bool = False) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *map(str, args)],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self.lines: list[list[str]] = []
        self._cond = threading.Condition()
        self._eof = False
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break  # cut short by the kill (lines are single writes, so this is rare)
            with self._cond:
                self.lines.append(raw.decode().split())
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, done: Callable[[list[list[str]]], bool], timeout: float = 20) -> None:
        """Wait until ``done(lines)``; fail with the child's stderr if it exits first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self.lines):
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    break
                self._cond.wait(left)
            else:
                return
        self.kill()
        pytest.fail(f"child {self.proc.args[2:]} did not get there:\n{self.stderr()}")

    def kill(self) -> None:
        """SIGKILL (if still running), reap, and collect the remaining output."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._thread.join()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        self.kill()
        self._stderr.close()


class Entry(NamedTuple):
    """What the test knows about one message present in the log."""

    key: Key
    timetick: int
    term: int


class Model:
    """Everything verified so far, which every later round must still see."""

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}  # id -> entry, for ids >= first
        self.first = 0  # the first retained id
        self.max_tick = 0
        self.terms: dict[int, int] = {}  # round -> the writer term of its child
        self.next_parent_seq = 0


def _seq(message_id: walsvc.MessageId | None) -> int:
    assert isinstance(message_id, FileMessageId)
    return message_id.seq


def _url(directory: Path) -> str:
    return f"file://{directory}"


async def _read_all(wal: walsvc.WAL) -> list[ImmutableMessage]:
    last = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    if last is None:
        return out
    async with asyncio.timeout(30), wal.read(DeliverPolicy.all(), timeticks=True) as scanner:
        async for message in scanner:
            out.append(message)
            if message.message_id >= last:
                break
    return out


async def _read_only_view(directory: Path) -> list[ImmutableMessage]:
    async with await open_bare(_url(directory), PCHANNEL, read_only=True) as wal:
        return await _read_all(wal)


async def _durable_end(directory: Path) -> int:
    async with await open_bare(_url(directory), PCHANNEL, read_only=True) as wal:
        last = await wal.latest_message_id()
    assert last is not None
    return _seq(last) + 1


async def _recover_and_append(
    directory: Path, model: Model, appends: int, truncate_to: int | None
) -> tuple[list[ImmutableMessage], int, list[tuple[int, int]]]:
    """Reopen read-write (recovering the tail), read everything, append ``appends``
    parent messages, maybe truncate; return (messages, term, [(id, tick)] appended)."""
    async with await open_bare(_url(directory), PCHANNEL, segment_size=SEGMENT_SIZE) as wal:
        messages = await _read_all(wal)
        appended = []
        for _ in range(appends):
            seq = model.next_parent_seq
            model.next_parent_seq += 1
            result = await wal.append(expected_message(-1, PARENT, seq))
            appended.append((_seq(result.message_id), result.timetick))
        if truncate_to is not None:
            await wal.truncate(FileMessageId(truncate_to))
        return messages, wal.term, appended


def _check_log(
    messages: list[ImmutableMessage],
    model: Model,
    round_: int,
    *,
    firsts: set[int],
    acks: dict[Key, tuple[int, int]],
) -> dict[int, Entry]:
    """Check one read-back of the whole retained log against the model and this round's
    acks; return the entries it shows."""
    assert messages, "the log lost everything"
    ids = [_seq(m.message_id) for m in messages]
    assert ids == list(range(ids[0], ids[0] + len(ids))), "ids are not dense"
    assert ids[0] in firsts, f"log starts at {ids[0]}, expected one of {sorted(firsts)}"
    ticks = [m.timetick for m in messages]
    assert all(a < b for a, b in itertools.pairwise(ticks)), "ticks not increasing"

    seen: dict[int, Entry] = {}
    per_producer: dict[int, list[int]] = defaultdict(list)
    for message in messages:
        key = check_message(message)  # intact: exactly what some producer wrote
        seq = _seq(message.message_id)
        seen[seq] = Entry(key, message.timetick, message.term)
        if key[0] != round_:
            assert seq in model.entries, f"message {seq} {key} appeared from nowhere"
        else:
            per_producer[key[1]].append(key[2])
            assert round_ in model.terms, "messages from a child that never opened"
            assert message.term == model.terms[round_]
            assert message.timetick > model.max_tick, "a new tick is not above the old ones"

    # Everything verified earlier (and not truncated) is still there, unchanged.
    for seq, entry in model.entries.items():
        if seq >= ids[0]:
            assert seen.get(seq) == entry, f"message {seq} changed or vanished"
    # Every acknowledged message is present where and as it was acknowledged.
    for key, (seq, tick) in acks.items():
        assert seen.get(seq) == Entry(key, tick, model.terms[round_]), f"ack {key} lost"
    # Per producer: a gap-free prefix, at most one in-flight batch (<= 4) past its last ack.
    for producer, seqs in per_producer.items():
        assert seqs == list(range(len(seqs))), f"producer {producer} has gaps: {seqs[:20]}"
        last_ack = max((k[2] for k in acks if k[1] == producer), default=-1)
        assert len(seqs) - 1 <= last_ack + 4
    for key in acks:
        assert key[2] < len(per_producer[key[1]])
    return seen


def _segment_frames(data: bytes) -> list[tuple[int, int, int]]:
    """(end offset, first seq, end seq) of the whole, valid frames at the start of ``data``
    (up to the writer's zero-filled runway, if any, or a frame torn by the kill: a
    ``pwrite`` cut short by SIGKILL leaves a frame whose body ends in the runway's zeros,
    whole in length but failing its CRC; the reopen cuts it, and raises if a valid frame
    followed it)."""
    frames = []
    at = 0
    while len(data) - at >= FRAME_HEADER_SIZE and data[at : at + 4] != bytes(4):
        try:
            header = parse_frame_header(data, at, at)
        except CorruptRecord:
            break
        body = data[header.body_offset : header.end]
        if len(body) != header.body_length:
            break
        try:
            verify_frame(header, body)
        except CorruptRecord:
            break
        frames.append((header.end, header.first_seq, header.end_seq))
        at = header.end
    return frames


def _lose_power(directory: Path, rng: random.Random, durable_end: int) -> str:
    """Make the newest segment look as a machine crash can leave it under
    ``sync="always"``: maybe drop what was written after the last published durable end
    (``durable_end``, from the head file), then leave a torn last write after it: a prefix
    of a frame, or the frame with its body zeroed from some point on, or zeros only."""
    names = sorted(n for n in os.listdir(directory / PCHANNEL) if n.endswith(".seg"))
    path = directory / PCHANNEL / names[-1]
    data = path.read_bytes()
    frames = _segment_frames(data)
    end, next_seq = 0, int(names[-1][:20])
    for frame_end, first_seq, end_seq in frames:
        if rng.random() < 0.5 and first_seq >= durable_end:
            break  # never made durable: lost with the page cache
        end, next_seq = frame_end, end_seq
    records = [
        encode(expected_message(-2, 0, k), timetick=1, term=1) for k in range(rng.randint(1, 3))
    ]
    torn = encode_frames(next_seq, records)
    how = rng.choice(["prefix", "zeroed-body", "zeros"])
    if how == "prefix":
        torn = torn[: rng.randrange(1, len(torn))]
    elif how == "zeroed-body":
        cut = rng.randrange(FRAME_HEADER_SIZE, len(torn) - 1)
        torn = torn[:cut] + bytes(len(torn) - cut)
    else:
        torn = bytes(rng.randrange(1, 9000))
    with path.open("r+b") as f:
        f.truncate(end)
        f.seek(end)
        f.write(torn)
        f.truncate(max(len(data), f.tell()))  # the writer's zero-filled runway survives
    return f"{how} tail after byte {end} of {names[-1]}"


def _kill_at_random(child: Child, rng: random.Random) -> str:
    """Kill the writer at a random moment; return which kind of moment (for messages)."""
    mode = rng.choices(["acks", "time", "open"], weights=[5, 3, 2])[0]
    if mode == "acks":
        target = rng.randint(1, 1500)
        child.wait_for(lambda lines: sum(1 for x in lines if x[0] == "A") >= target)
    elif mode == "time":
        child.wait_for(lambda lines: any(x[0] == "READY" for x in lines))
        time.sleep(rng.uniform(0, 0.3))
    else:  # while it opens: recovery, tick recovery, the first batches
        child.wait_for(lambda lines: any(x[0] == "OPENING" for x in lines))
        time.sleep(rng.uniform(0, 0.03))
    child.kill()
    return mode


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path: Path, seed: random.Random) -> None:
    with contextlib.ExitStack() as cleanup:
        _crash_rounds(tmp_path, seed, cleanup)


def _crash_rounds(tmp_path: Path, seed: random.Random, cleanup: contextlib.ExitStack) -> None:
    directory = tmp_path / "log"
    model = Model()
    # Start with a few messages so every round has something old to keep intact.
    messages, term, appended = asyncio.run(_recover_and_append(directory, model, 3, None))
    assert messages == []
    model.terms[-1] = term
    for i, (seq, tick) in enumerate(appended):
        model.entries[seq] = Entry((-1, PARENT, i), tick, term)
    model.max_tick = appended[-1][1]
    killed_with_acks = 0

    for round_ in range(ROUNDS):
        retained = sorted(model.entries)
        truncate_to = -1
        if round_ != READER_ROUND and len(retained) > RETAIN // 2 and seed.random() < 0.7:
            truncate_to = retained[len(retained) - RETAIN // 2]
        reader = None
        if round_ == READER_ROUND:
            reader = Child("read", directory)
            cleanup.callback(reader.close)
            reader.wait_for(lambda lines: any(x[0] == "READY" for x in lines))
        writer = Child(
            "write",
            directory,
            round_,
            seed.randrange(2**32),
            PRODUCERS,
            SEGMENT_SIZE,
            truncate_to,
        )
        try:
            mode = _kill_at_random(writer, seed)
        finally:
            writer.close()
        lines = writer.lines
        context = f"round {round_}, killed at a random {mode!r} moment"
        if seed.random() < 0.4:
            durable_end = asyncio.run(_durable_end(directory))
            context += ", then a power loss left a " + _lose_power(directory, seed, durable_end)

        for line in lines:
            if line[0] == "READY":
                model.terms[round_] = int(line[1])
        acks: dict[Key, tuple[int, int]] = {}
        for line in lines:
            if line[0] == "A":
                r, p, s, seq, tick = map(int, line[1:])
                acks[(r, p, s)] = (seq, tick)
        killed_with_acks += bool(acks)
        firsts = {model.first}
        if ["T", str(truncate_to)] in lines:
            firsts.add(truncate_to + 1)
        if ["TD", str(truncate_to)] in lines:
            firsts = {truncate_to + 1}

        # 1. Read-only, before anything recovers the tail.
        ro = asyncio.run(_read_only_view(directory))
        try:
            _check_log(ro, model, round_, firsts=firsts, acks=acks)
        except AssertionError as exc:
            raise AssertionError(f"{context}, read-only view: {exc}") from exc

        # 2. Read-write: recovery, then appends continue the log.
        retained_after = len(ro)
        parent_truncate = None
        if reader is None and retained_after > RETAIN:
            parent_truncate = _seq(ro[-RETAIN // 2].message_id)
        appends = 3 if reader is not None else 1
        rw, term, appended = asyncio.run(
            _recover_and_append(directory, model, appends, parent_truncate)
        )
        try:
            seen = _check_log(rw, model, round_, firsts=firsts, acks=acks)
        except AssertionError as exc:
            raise AssertionError(f"{context}, after recovery: {exc}") from exc
        assert ro == rw[: len(ro)], f"{context}: the read-only view is not a prefix"
        assert term > max(model.terms.values()), "reopening did not raise the term"

        # The appends after recovery continue the log: next id, a tick above all others.
        last_seq = _seq(rw[-1].message_id)
        max_tick = max(model.max_tick, rw[-1].timetick)
        for i, (seq, tick) in enumerate(appended):
            assert seq == last_seq + 1 + i, f"{context}: append after recovery got id {seq}"
            assert tick > max_tick, f"{context}: append after recovery got an old tick"
            max_tick = tick
            key = (-1, PARENT, model.next_parent_seq - len(appended) + i)
            seen[seq] = Entry(key, tick, term)

        model.terms[-1] = term
        model.entries = seen
        model.first = _seq(rw[0].message_id)
        model.max_tick = max_tick
        if parent_truncate is not None:
            model.first = parent_truncate + 1
            model.entries = {k: v for k, v in seen.items() if k >= model.first}

        if reader is not None:
            _check_reader(reader, model, appended[-1][0], context)

    # The kill points must have hit appends in flight, not only idle moments.
    assert killed_with_acks >= ROUNDS // 3


def _check_reader(reader: Child, model: Model, until: int, context: str) -> None:
    """The reader saw only messages that survived the crash, and tailed across recovery."""
    try:
        reader.wait_for(lambda lines: any(x[0] == "M" and int(x[1]) >= until for x in lines))
    finally:
        reader.close()
    bad = [line for line in reader.lines if line[0] == "BAD"]
    assert not bad, f"{context}: the reader read damaged messages: {bad[:5]}"
    seen = [line for line in reader.lines if line[0] == "M"]
    ids = [int(line[1]) for line in seen]
    assert ids == list(range(ids[0], ids[0] + len(ids))), f"{context}: reader ids not dense"
    for line in seen:
        seq, tick, r, p, s = map(int, line[1:])
        entry = model.entries.get(seq)
        assert entry is not None, f"{context}: reader saw {seq}, which recovery dropped"
        assert (entry.key, entry.timetick) == ((r, p, s), tick), context
