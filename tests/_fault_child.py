"""The producer process of the fault schedule (``test_fault_schedule.py``).

Run as ``python _fault_child.py URL ROUND SEED LOOP RETRY_FILE INJECT_ENOSPC``: open
``URL``'s pchannel read-write with the default chain and append keyed work until killed
or out of work, as an impatient client does: each attempt under a random deadline or
cancelled outright, retried with the same key until one answers. The work is the keys
in ``RETRY_FILE`` first (what the round before had in flight when it was killed), then
new ones: single messages, batches (``append_many``) and transactions with a key. A
``WALError`` other than a timeout makes it reopen the WAL and try again, or, half the
time after ``AppendOutcomeUnknown``/``BackendUnavailable``, try the same WAL again (its
writer cuts the log back to the durable end after an I/O error and goes on).
``INJECT_ENOSPC`` = 1 (machines that cannot mount a small tmpfs): every 30th Python-level
write of the log fails with ENOSPC, as a full disk does.

Lines, each flushed when its event happened::

    READY term               the WAL is open
    TRY kind key             about to attempt the work ``key`` (msg, batch, txn) first
    ACK key seq tick         the keyed message ``key`` is acknowledged at ``seq``
    TXN key seq bodies       the transaction ``key`` committed (or replayed) at ``seq``
    ERR Type                 an attempt raised ``Type`` (a WALError subclass, or not)
    DONE                     the work ran out
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import os
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import prometheus_client
from _impatient import GAVE_UP, impatient_attempt

import walsvc
import walsvc.metrics
from walsvc import AppendResult, Message

PCHANNEL = "faults"
PRODUCERS = 6
#: Errors after which a producer tries the same WAL again half the time (a full disk or
#: an I/O error fails a batch, not the writer), and reopens it otherwise.
TRANSIENT = (walsvc.AppendOutcomeUnknown, walsvc.BackendUnavailable)
WORK_PER_ROUND = 400
BODIES = 2


def say(*words: object) -> None:
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


class Holder:
    """The producers' WAL, reopened after errors."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.wal: walsvc.WAL | None = None
        self.generation = 0
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        while True:
            try:
                self.wal = await walsvc.open_wal(self.url, PCHANNEL, segment_size=64 * 1024)
            except walsvc.WALError as exc:
                say("ERR", type(exc).__name__)
                await asyncio.sleep(0.05)
                continue
            say("READY", self.wal.term)
            return

    async def reopen(self, seen: int) -> None:
        async with self._lock:
            if self.generation != seen:
                return  # another producer reopened it already
            old, self.wal = self.wal, None
            if old is not None:
                try:
                    await old.aclose()
                except walsvc.WALError as exc:
                    say("ERR", type(exc).__name__)
                check_batches_ended(old)
            await asyncio.sleep(0.02)
            await self.open()
            self.generation += 1


async def attempt(
    holder: Holder, rng: random.Random, call: Callable[[walsvc.WAL], Awaitable[Any]]
) -> Any:
    """``call`` retried until it answers: random deadlines and cancellations, a reopen
    after other errors. Every error is reported."""
    while True:
        wal, generation = holder.wal, holder.generation
        if wal is None:
            await asyncio.sleep(0.01)
            continue
        try:
            result = await impatient_attempt(
                rng, functools.partial(call, wal), deadlines=(0, 0.0002, 0.001, 0.005)
            )
            if result is not GAVE_UP:
                return result
        except walsvc.WALError as exc:
            say("ERR", type(exc).__name__)
            if isinstance(exc, TRANSIENT) and rng.random() < 0.5:
                await asyncio.sleep(0.01)  # the same WAL again: its writer recovers
            else:
                await holder.reopen(generation)
        except Exception as exc:  # a bug: say so (the test fails on it) and go on
            say("ERR", type(exc).__name__)
            await asyncio.sleep(0.01)


def message(key: str) -> Message:
    return Message(payload=key.encode() * 8, vchannel="orders", idempotency_key=key)


async def do_work(holder: Holder, rng: random.Random, kind: str, key: str) -> None:
    say("TRY", kind, key)
    if kind == "msg":
        result: AppendResult = await attempt(holder, rng, lambda wal: wal.append(message(key)))
        say("ACK", key, result.message_id.seq, result.timetick)
    elif kind == "batch":
        keys = [f"{key}.{i}" for i in range(3)]
        results = await attempt(
            holder, rng, lambda wal: wal.append_many([message(k) for k in keys])
        )
        for k, r in zip(keys, results, strict=True):
            say("ACK", k, r.message_id.seq, r.timetick)
    else:

        async def transaction(wal: walsvc.WAL) -> walsvc.Txn:
            async with wal.txn("orders", idempotency_key=key) as txn:
                await txn.append_many(
                    [
                        Message(payload=f"{key}/{i}".encode(), vchannel="orders")
                        for i in range(BODIES)
                    ]
                )
            return txn

        txn = await attempt(holder, rng, transaction)
        assert txn.commit_result is not None
        say("TXN", key, txn.commit_result.message_id.seq, BODIES)


async def main(url: str, round_: int, seed: int, retry: list[list[str]]) -> None:
    rng = random.Random(seed)
    fresh = (
        (rng.choices(("msg", "batch", "txn"), (6, 2, 2))[0], f"r{round_}-{n}")
        for n in range(WORK_PER_ROUND)
    )
    work = itertools.chain(((kind, key) for kind, key in retry), fresh)
    scraping = None
    if rng.random() < 0.5:  # half the rounds append with metrics on, scraped meanwhile
        registry = prometheus_client.CollectorRegistry()
        walsvc.metrics.enable(registry)  # before the WAL opens: only it records
        scraping = asyncio.get_running_loop().create_task(scrape_while_appending(registry))
    holder = Holder(url)
    await holder.open()

    async def producer(p: int) -> None:
        own = random.Random(rng.random())
        for kind, key in work:
            await do_work(holder, own, kind, key)

    await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))
    if scraping is not None:
        scraping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scraping
    say("DONE")
    if holder.wal is not None:
        await holder.wal.aclose()
        check_batches_ended(holder.wal)


def check_batches_ended(wal: walsvc.WAL) -> None:
    """A closed WAL's metrics hold no batch in flight: every batch its coalescers
    started ended, on the failure paths too (cancellations, deadlines, full disks). Said
    as an error that is no ``WALError``, which fails the schedule's check of errors."""
    metrics = getattr(wal, "_metrics", None)
    if metrics is not None and metrics.batches_in_flight():
        say("ERR", f"MetricsBatchesLeftInFlight:{metrics.batches_in_flight()}")


async def scrape_while_appending(registry: prometheus_client.CollectorRegistry) -> None:
    """Scrape ``registry`` every few milliseconds while the producers work: the
    recording sites run on the failure paths too (timeouts, cancellations, full disks,
    reopens), and a scrape must never fail."""
    while True:
        assert b"walsvc_client_reconnects_total" in prometheus_client.generate_latest(registry)
        await asyncio.sleep(0.005)


def inject_enospc() -> None:
    """Every 30th Python-level write of the log fails with ENOSPC (a full disk)."""
    import walsvc.backends._file._writer as writer

    writer._ccommit = None  # type: ignore[assignment]  # every batch takes the Python worker
    counter = itertools.count(1)
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if next(counter) % 30 == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    os.pwrite = pwrite  # type: ignore[assignment]


if __name__ == "__main__":
    url, round_, seed, loop, retry_file, enospc = sys.argv[1:7]
    if enospc == "1":
        inject_enospc()
    if loop == "uvloop":
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()
    with open(retry_file) as lines:
        retry = [line.split() for line in lines if line.strip()]
    with runner:
        runner.run(main(url, int(round_), int(seed), retry))
