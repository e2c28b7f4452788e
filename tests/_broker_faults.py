"""The seeded fault schedule of the broker-backed WALs (``test_kafka_faults.py``,
``test_pulsar_faults.py``; issue 20's acceptance).

Several producers append keyed and unkeyed messages through the default chain, each
attempt under a random deadline or cancelled at a random moment. A keyed message is tried
again with its key after a deadline, a cancellation, ``AppendOutcomeUnknown``, a
retriable error, or ``WALFenced``/``WALClosed`` from a WAL the schedule replaced, until it
is answered; an unkeyed one is never tried twice. Meanwhile the schedule pauses the broker
(SIGSTOP) and resumes it at random points, restarts it where it keeps its data (Pulsar
Lite: same port and data directory), and now and then opens the WAL anew (a restarted
producer: the new writer fences the old one, which is closed).

Afterwards a fresh reader reads the whole log, and:

- every acknowledged message is delivered exactly once, at the id it was acknowledged
  with (every acknowledgement of a key names the same id);
- no id was acknowledged for two messages;
- no key (no message) is delivered twice;
- an unkeyed append that failed with an error promising nothing was written
  (``BackendUnavailable``, ``WALClosed``, ``WALFenced``) is not delivered;
- every exception an append raised is a ``walsvc.WALError`` (besides the caller's own
  deadline and cancellation), and closing a WAL raised nothing.

``WALSVC_SOAK=N`` makes the schedule N times longer.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _stacks import stacks_on_timeout

import walsvc
from walsvc import DeliverPolicy, Message, MessageType

__all__ = ("SOAK", "BrokerControl", "FaultSchedule")

SOAK = int(os.environ.get("WALSVC_SOAK", "1"))
PRODUCERS = 6
#: Errors that promise the append wrote nothing.
NOTHING_WRITTEN = (walsvc.BackendUnavailable, walsvc.WALClosed, walsvc.WALFenced)
#: Errors after which a keyed append is tried again with its key.
RETRIED = (walsvc.AppendOutcomeUnknown, walsvc.WALClosed, walsvc.WALFenced)
#: Attempts a keyed message gets once the schedule is over (the broker answers again).
FINAL_ATTEMPTS = 30


@dataclass
class BrokerControl:
    """What the schedule may do to the broker: ``restart`` (blocking) is None where the
    broker keeps no data across a restart (Tansu)."""

    url: str
    pause: Callable[[], None]
    resume: Callable[[], None]
    restart: Callable[[], None] | None = None


@dataclass
class Ledger:
    """What the producers were told."""

    acks: dict[str, set[walsvc.MessageId]] = field(default_factory=dict)
    nothing_written: set[str] = field(default_factory=set)
    unresolved: set[str] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)
    #: The last errors the appends raised, newest last (shown if the run hangs).
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=8))
    strange: list[str] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)


class FaultSchedule:
    """One run of the schedule on a fresh pchannel (see the module docstring)."""

    def __init__(
        self,
        broker: BrokerControl,
        pchannel: str,
        rng: random.Random,
        options: dict[str, Any],
        seconds: float,
    ) -> None:
        self.broker = broker
        self.pchannel = pchannel
        self.rng = rng
        self.options = options
        self.seconds = seconds * SOAK
        self.ledger = Ledger()
        self.wal: walsvc.WAL | None = None
        self._closing: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    # -- the run ------------------------------------------------------------------------

    async def run(self) -> Ledger:
        self.wal = await self._open()
        producers = [
            asyncio.create_task(self._produce(k, random.Random(self.rng.random())))
            for k in range(PRODUCERS)
        ]
        try:
            await self._faults(asyncio.get_running_loop().time() + self.seconds)
        finally:
            self.broker.resume()
            self._stopping.set()
        async with stacks_on_timeout(240, "the schedule's final phase", self._state):
            await asyncio.gather(*producers)
            assert self.wal is not None
            await self._close(self.wal)
            await asyncio.gather(*self._closing)
        return self.ledger

    def _state(self) -> str:
        """What the run has seen so far (for the dump of a run that hangs)."""
        ledger = self.ledger
        return (
            f"faults {dict(ledger.events)}; errors {dict(ledger.errors)}; the last:\n  "
            + "\n  ".join(ledger.recent)
        )

    async def _open(self) -> walsvc.WAL:
        """A new writer, tried until the broker lets it open (it may be restarting)."""
        async with stacks_on_timeout(120, "opening a WAL"):
            while True:
                try:
                    return await walsvc.open_wal(self.broker.url, self.pchannel, **self.options)
                except walsvc.BackendUnavailable as exc:
                    self.ledger.errors[f"open:{type(exc).__name__}"] += 1
                    await asyncio.sleep(0.5)

    async def _close(self, wal: walsvc.WAL) -> None:
        try:
            await wal.aclose()
        except BaseException as exc:  # closing never raises, cancelled or not
            self.ledger.strange.append(f"aclose raised {exc!r}")

    async def _faults(self, end: float) -> None:
        loop = asyncio.get_running_loop()
        rng, ledger = self.rng, self.ledger
        while loop.time() < end:
            await asyncio.sleep(rng.uniform(0.1, 1.0))
            choice = rng.random()
            if choice < 0.55:
                ledger.events["pause"] += 1
                self.broker.pause()
                # short, or longer than the request timeouts the tests use
                await asyncio.sleep(rng.uniform(0.05, 1.0) if rng.random() < 0.6 else 6.0)
                self.broker.resume()
            elif choice < 0.65 and self.broker.restart is not None:
                ledger.events["restart"] += 1
                await loop.run_in_executor(None, self.broker.restart)
            elif choice < 0.85:
                ledger.events["reopen"] += 1
                new = await self._open()
                old, self.wal = self.wal, new
                assert old is not None
                self._closing.append(asyncio.create_task(self._close(old)))

    # -- the producers ------------------------------------------------------------------

    async def _produce(self, k: int, rng: random.Random) -> None:
        for i in range(10**9):
            if self._stopping.is_set():
                return
            label = f"p{k}-{i}"
            keyed = rng.random() < 0.5
            message = Message(
                payload=label.encode(), vchannel="v", idempotency_key=label if keyed else None
            )
            attempts = 0
            while True:
                final = self._stopping.is_set()
                attempts += 1
                outcome, result = await self._attempt(message, rng, calm=final)
                if isinstance(result, walsvc.AppendResult):
                    self.ledger.acks.setdefault(label, set()).add(result.message_id)
                    break
                if isinstance(result, walsvc.WALError):
                    self.ledger.errors[type(result).__name__] += 1
                    self.ledger.recent.append(f"{label}: {result!r}")
                if not keyed:
                    if isinstance(result, NOTHING_WRITTEN):
                        self.ledger.nothing_written.add(label)
                    break
                if outcome == "error" and not (
                    isinstance(result, RETRIED)
                    or (isinstance(result, walsvc.WALError) and result.retriable)
                ):
                    break  # refused for good: not written
                if final and attempts > FINAL_ATTEMPTS:
                    self.ledger.unresolved.add(label)
                    break
                await asyncio.sleep(rng.uniform(0, 0.05) if not final else 0.2)

    async def _attempt(
        self, message: Message, rng: random.Random, *, calm: bool
    ) -> tuple[str, object]:
        """One append through the current WAL: ("ok", result), ("error", WALError),
        ("deadline" | "cancelled", None), or ("strange", exception)."""
        wal = self.wal
        assert wal is not None
        deadline = None if calm else rng.choice([None, None, None, 0.01, 0.2, 1.0, 3.0])
        cancel_at = rng.uniform(0, 0.2) if not calm and rng.random() < 0.1 else None
        task = asyncio.ensure_future(self._append(wal, message, deadline))
        handle = None
        if cancel_at is not None:
            handle = asyncio.get_running_loop().call_later(cancel_at, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise
            if handle is not None and task.cancelled():
                self.ledger.events["cancelled"] += 1
                return "cancelled", None
            self.ledger.strange.append("append raised CancelledError, cancelled by nobody")
            return "strange", None
        finally:
            if handle is not None:
                handle.cancel()

    async def _append(
        self, wal: walsvc.WAL, message: Message, deadline: float | None
    ) -> tuple[str, object]:
        try:
            async with asyncio.timeout(deadline) as scope:
                return "ok", await wal.append(message)
        except TimeoutError as exc:
            if scope.expired():
                self.ledger.events["deadline"] += 1
                return "deadline", None
            self.ledger.strange.append(f"append raised {exc!r}")
            return "strange", exc
        except walsvc.WALError as exc:
            return "error", exc
        except Exception as exc:
            self.ledger.strange.append(f"append raised {exc!r}")
            return "strange", exc

    # -- the check ----------------------------------------------------------------------

    async def verify(self) -> str:
        """Read the log with a fresh reader and check it against the ledger (see the
        module docstring); a summary line of the run."""
        ledger = self.ledger
        assert not ledger.strange, ledger.strange[:10]
        delivered: dict[str, list[walsvc.MessageId]] = {}
        keys: Counter[str] = Counter()
        async with await walsvc.open_wal(self.broker.url, self.pchannel, read_only=True) as wal:
            latest = await wal.latest_message_id()
            assert latest is not None
            async with (
                stacks_on_timeout(120, "the check's read"),
                wal.read(DeliverPolicy.all(), raw=True, use_cache=False) as scanner,
            ):
                async for message in scanner:
                    if message.type is MessageType.INSERT:
                        delivered.setdefault(message.payload.decode(), []).append(
                            message.message_id
                        )
                        if message.idempotency_key is not None:
                            keys[message.idempotency_key] += 1
                    if not message.message_id < latest:
                        break
        twice = {key: n for key, n in keys.items() if n > 1}
        assert not twice, f"keys delivered more than once: {sorted(twice)[:10]}"
        again = {label: ids for label, ids in delivered.items() if len(ids) > 1}
        assert not again, f"messages delivered more than once: {sorted(again)[:10]}"
        owners: dict[walsvc.MessageId, str] = {}
        at_id = {ids[0]: label for label, ids in delivered.items()}
        for label, ids in ledger.acks.items():
            assert len(ids) == 1, f"{label} was acknowledged with different ids: {ids}"
            (at,) = ids
            assert owners.setdefault(at, label) == label, f"{at} acknowledged twice"
            if delivered.get(label) != [at]:
                near = sorted(i for i in at_id if abs(_position(i) - _position(at)) <= 2)
                raise AssertionError(
                    f"{label} acknowledged at {at}, delivered at {delivered.get(label)};"
                    f" the reader read through {latest}; delivered near it:"
                    f" {[(i, at_id[i]) for i in near]}; a reader from it delivers first"
                    f" {await self._first_from(at)}; faults {dict(ledger.events)}"
                )
        written = sorted(label for label in ledger.nothing_written if label in delivered)
        assert not written, f"failed as not written, but delivered: {written[:10]}"
        assert ledger.acks, f"the schedule acknowledged nothing: {ledger}"
        return (
            f"{len(ledger.acks)} acknowledged, {len(delivered)} delivered, faults"
            f" {dict(ledger.events)}, errors {dict(ledger.errors)}, unresolved keys"
            f" {sorted(ledger.unresolved)[:10]}"
        )

    async def _first_from(self, at: walsvc.MessageId) -> object:
        """(id, label) of the first INSERT a fresh reader delivers from ``at`` (a
        diagnostic of a failed check)."""
        try:
            async with await walsvc.open_wal(self.broker.url, self.pchannel, read_only=True) as wal:
                async with (
                    asyncio.timeout(20),
                    wal.read(DeliverPolicy.start_from(at), raw=True, use_cache=False) as scanner,
                ):
                    async for message in scanner:
                        if message.type is MessageType.INSERT:
                            return message.message_id, message.payload.decode()
        except Exception as exc:
            return exc
        return None


def _position(message_id: walsvc.MessageId) -> int:
    """A number that orders ids of one log roughly (offset, or Pulsar entry)."""
    return int(getattr(message_id, "seq", getattr(message_id, "entry", 0)))
