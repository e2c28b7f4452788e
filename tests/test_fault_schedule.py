"""The seeded fault schedule: what an acknowledged append survives on ``file://``.

A producer process (``_fault_child.py``) appends keyed messages, keyed batches and keyed
transactions with the default chain, under random deadlines and cancellations, retrying
each with its key until answered, and reopening the WAL after other errors. Each round
the schedule picks some of:

- SIGKILL at a random moment; the next round retries the work the killed one had in
  flight, with the same keys (a crash-restarted producer);
- a full disk at a random moment (a small tmpfs filled to the last byte where the machine
  allows mounting one, else ENOSPC injected in the child), freed a little later;
- a torn write left after the durable end (a crash mid-append), which a writer's open
  must cut;
- one bit flipped in an acknowledged frame of an older segment: every read that crosses
  it must report CorruptRecord naming the segment (and ``walsvc check`` must find it);
  the bit is then put back.

After every round: every acknowledged key is in the log exactly once, at the id every
acknowledgement of it named; no key is in the log twice (in flight when killed included);
each id holds one message; every committed transaction is delivered exactly once with
its bodies; every error an append raised was a ``walsvc.WALError``; and in the rounds
that record metrics, every WAL the child closed holds no coalesced batch in flight (its
child says otherwise as an error that is no ``WALError``).

``WALSVC_SOAK=N`` runs N times as many rounds (``make soak``).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from _full_disk import fill, small_filesystem

import walsvc
from walsvc import DeliverPolicy, MessageType
from walsvc.apps._cli import main as cli
from walsvc.backends._file._format import FRAME_HEADER_SIZE, encode_frames, segment_seq
from walsvc.backends._file._head import HeadFile

CHILD = Path(__file__).with_name("_fault_child.py")
PCHANNEL = "faults"
ROUNDS = 6 * int(os.environ.get("WALSVC_SOAK", "1"))
#: Every name walsvc gives an error class: what an append may raise.
WAL_ERRORS = {
    name
    for name in dir(walsvc)
    if isinstance(getattr(walsvc, name), type)
    and issubclass(getattr(walsvc, name), walsvc.WALError)
}


class Producer:
    """A running ``_fault_child.py``; a thread collects its lines."""

    def __init__(self, url: str, round_: int, seed: int, retry: list[str], enospc: bool) -> None:
        self._retry = tempfile.NamedTemporaryFile("w", suffix=".work", delete=False)
        self._retry.write("\n".join(retry))
        self._retry.close()
        self._stderr = tempfile.TemporaryFile()
        loop = "uvloop" if seed % 2 else "asyncio"
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), url, str(round_), str(seed), loop, self._retry.name,
             "1" if enospc else "0"],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )  # fmt: skip
        self.lines: list[list[str]] = []
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.endswith(b"\n"):
                self.lines.append(raw.decode().split())

    def count(self, tag: str) -> int:
        return sum(1 for line in list(self.lines) if line[0] == tag)

    def finish(self, kill_after: float | None) -> None:
        """Let it run for ``kill_after`` seconds, then SIGKILL it (None: until it is out
        of work, failing the test past 120 s)."""
        try:
            self.proc.wait(timeout=120 if kill_after is None else kill_after)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            if kill_after is None:
                pytest.fail(f"the producer did not finish:\n{self.stderr()}")
        self._thread.join(timeout=30)
        os.unlink(self._retry.name)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        error = self.stderr()
        self._stderr.close()
        if kill_after is None or self.proc.returncode != -9:
            assert self.proc.returncode == 0, error

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]


class Ledger:
    """What the producers were told, over every round."""

    def __init__(self) -> None:
        self.acks: dict[str, set[tuple[int, int]]] = {}  # key -> {(seq, tick)}
        self.txns: dict[str, set[int]] = {}  # key -> {commit seq}
        self.errors: Counter[str] = Counter()

    def take(self, lines: list[list[str]]) -> list[str]:
        """Record a round's lines; return the work it had in flight (to retry)."""
        tried: dict[str, str] = {}
        done: set[str] = set()
        for line in lines:
            tag = line[0]
            if tag == "TRY":
                tried[line[2]] = line[1]
            elif tag == "ACK":
                self.acks.setdefault(line[1], set()).add((int(line[2]), int(line[3])))
                done.add(line[1].rsplit(".", 1)[0] if line[1].count(".") else line[1])
            elif tag == "TXN":
                self.txns.setdefault(line[1], set()).add(int(line[2]))
                done.add(line[1])
            elif tag == "ERR":
                self.errors[line[1]] += 1
        return [f"{kind} {key}" for key, kind in tried.items() if key not in done]


def _log(url: str) -> tuple[list[walsvc.ImmutableMessage], list[walsvc.ImmutableMessage]]:
    """The log as stored (raw) and as a transaction-aware reader delivers it (up to the
    newest message such a reader delivers: a transaction a killed producer left open at
    the end holds its messages back until the next writer rolls it back)."""

    async def read(raw: bool, last: walsvc.MessageId | None) -> list[walsvc.ImmutableMessage]:
        async with await walsvc.open_wal(url, PCHANNEL, read_only=True) as wal:
            last = last or await wal.latest_message_id()
            out: list[walsvc.ImmutableMessage] = []
            if last is None:
                return out
            # timeticks: `last` may be a TimeTick, which a default read never delivers.
            reading = wal.read(DeliverPolicy.all(), raw=raw, timeticks=True)
            async with asyncio.timeout(60), reading as scanner:
                async for message in scanner:
                    if message.persisted:
                        out.append(message)
                    if not message.message_id < last:
                        return out
            return out

    if not (Path(url.removeprefix("file://")) / PCHANNEL / "head").exists():
        return [], []  # killed before it created the log
    stored = asyncio.run(read(True, None))
    visible = [m.message_id for m in stored if m.txn is None or m.type is MessageType.COMMIT_TXN]
    return stored, asyncio.run(read(False, visible[-1])) if visible else []


def _verify(url: str, ledger: Ledger) -> None:
    raw, delivered = _log(url)
    seqs = [m.message_id.seq for m in raw]
    assert len(seqs) == len(set(seqs)), "an id holds two messages"
    keyed = Counter(m.idempotency_key for m in raw if m.idempotency_key and m.txn is None)
    assert [k for k, n in keyed.items() if n > 1] == [], "a key landed twice"
    where = {m.idempotency_key: (m.message_id.seq, m.timetick) for m in raw if m.txn is None}
    for key, answers in ledger.acks.items():
        assert answers == {where.get(key)}, (
            f"{key}: acknowledged as {answers}, stored {where.get(key)}"
        )
    commits = Counter(m.idempotency_key for m in raw if m.type is MessageType.COMMIT_TXN)
    assert [k for k, n in commits.items() if n > 1] == [], "a transaction committed twice"
    committed = {
        m.idempotency_key: m for m in delivered if m.type is MessageType.TXN and m.idempotency_key
    }
    for key, answers in ledger.txns.items():
        txn = committed.get(key)
        assert txn is not None, f"transaction {key} was acknowledged but is not delivered"
        assert answers == {txn.message_id.seq}, key
        assert [b.payload for b in txn.body] == [f"{key}/{i}".encode() for i in range(2)]
    assert set(ledger.errors) <= WAL_ERRORS, (
        f"non-WALError errors: {set(ledger.errors) - WAL_ERRORS}"
    )


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if segment_seq(p.name) is not None)


def _tear(directory: Path, rng: random.Random) -> None:
    """A crash mid-append: a prefix of a frame at the durable end."""
    if not (directory / "head").exists():
        return
    head = HeadFile(str(directory / "head"), writable=False)
    state = head.read()
    head.close()
    path = directory / f"{state.end_segment:020d}.seg"
    frame = encode_frames(state.durable_end, [rng.randbytes(rng.randrange(40, 3000))])
    with path.open("r+b") as f:
        f.seek(state.end_offset)
        f.write(frame[: rng.randrange(1, len(frame))])


@pytest.mark.slow
def test_the_fault_schedule(tmp_path: Path, seed: random.Random) -> None:
    root = tmp_path / "disk"
    with small_filesystem(root, size="24m") as mounted:
        url = f"file://{root}"
        directory = root / PCHANNEL
        ledger = Ledger()
        retry: list[str] = []
        kills = retried = 0
        for round_ in range(ROUNDS):
            kill = seed.random() < 0.6
            full = seed.random() < 0.35
            child = Producer(url, round_, seed.randrange(1 << 30), retry, full and not mounted)
            if full and mounted:
                time.sleep(seed.uniform(0.05, 0.8))
                ballast = fill(root)
                time.sleep(seed.uniform(0.1, 0.6))
                ballast.unlink()
            child.finish(seed.uniform(0.05, 1.5) if kill else None)
            retry = ledger.take(child.lines)
            kills += child.proc.returncode == -9
            retried += len(retry)
            if seed.random() < 0.3:
                _tear(directory, seed)
            _verify(url, ledger)
            if seed.random() < 0.3:
                _flip_and_restore(directory, url, seed)
        assert ledger.acks, "the schedule acknowledged nothing"
        print(
            f"schedule: {ROUNDS} rounds, full disk {'real' if mounted else 'injected'},"
            f" {kills} kills, {retried} retried, {len(ledger.acks)} messages and"
            f" {len(ledger.txns)} transactions acknowledged, errors {dict(ledger.errors)}"
        )


def _flip_and_restore(directory: Path, url: str, rng: random.Random) -> None:
    """Flip a bit of an acknowledged frame in an older segment: reads crossing it must
    report it, naming the segment, and ``walsvc check`` must find it; then put it back."""
    segments = _segments(directory) if directory.exists() else []
    if len(segments) < 2:
        return
    victim = rng.choice(segments[:-1])
    pristine = victim.read_bytes()
    data = bytearray(pristine)
    at = rng.randrange(FRAME_HEADER_SIZE, len(data))
    data[at] ^= 1 << rng.randrange(8)
    victim.write_bytes(bytes(data))
    try:
        with pytest.raises(walsvc.CorruptRecord, match=victim.name):
            _log(url)
        assert cli(["check", url, PCHANNEL]) == 1
    finally:
        victim.write_bytes(pristine)
