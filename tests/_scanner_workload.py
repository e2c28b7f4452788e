"""The workloads of the read pipeline's property tests
(``test_scanner_properties.py``, ``test_scanner_fault_properties.py``) and the readers
they check against the reference model (``_scanner_model.py``).

A workload is a program of random, partly concurrent operations: appends, batches, DDL
and transactions (committed, rolled back, expired, or left open across a restart: the next
writer rolls them back) over the vchannels "v1", "v2" and the broadcast "", restarts,
timetick syncs, clock steps, and (on ``faultysub://`` only) appends that fail.

Readers, per vchannel V in ("v1", "v2", None = no filter), each drained by a task that
``pause`` ops hold between two messages:
- tailing readers (``latest()``) opened with each writer (in about half the sessions;
  in the others the cache activates when a reader opens mid-session, maybe with appends
  in flight, and deactivates when the last one closes);
- readers opened mid-session, concurrently with appends: ``all()`` (they start in the
  backend and hand off to the cache), ``from_checkpoint(m.checkpoint)`` of a message m
  delivered earlier (the model after m's position) and ``timetick_gt(m.timetick)``;
- writers with a tiny ``tail_cache_bytes`` or a short ``tail_cache_age`` (and a clock
  that advances) evict what paused or slow readers still need: they fall back to the
  backend, and hand off again when they catch up;
- a subscription per V that acks every message, stops after a random number of them or
  is closed by a restart, and is reopened later: its incarnations together deliver the
  model exactly (no gap, no duplicate), checked at each restart and, by a last writer,
  to the end of the log; that last writer (and a read-only WAL) also resume from the
  checkpoints of delivered messages.
At each session's end every reader must deliver exactly the model's messages it is due
(a reader without progress for 5 s fails), and over each test's run the hand-off,
fallback, transaction and idle-tick paths must all have been taken.

The clock is injected and the timetick sync driven by hand: nothing waits for a timer.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import sys
import types
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

import _faulty
import uvloop
from _chain_support import FakeClock, open_manual, whole_log
from _scanner_model import after, after_id, after_tick, keys, log_order_checks, model
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import scanners
import walsvc
from interceptors import TimetickSync
from walsvc import DeliverPolicy, ImmutableMessage, Message, MessageType
from walsvc.backends._subscriptions import SubscriptionStore

__all__ = (
    "FAULTY",
    "LOOPS",
    "SETTINGS",
    "FaultyBackend",
    "Run",
    "check_over_the_run",
    "run_on",
    "workloads",
)

_VCHANNELS: Final = ("v1", "v2", "")
_READ: Final[tuple[str | None, ...]] = ("v1", "v2", None)  # None: a reader without filter
_SLOTS: Final = 3
_DEFAULT_CACHE: Final = 64 << 20  # the default tail_cache_bytes
#: (tail_cache_bytes, tail_cache_age) of a writer: roomy, tiny (a few entries),
#: short-lived (1 s of the injected clock: "advance" evicts), both.
_CACHES: Final = ((_DEFAULT_CACHE, 30.0), (2000, 30.0), (_DEFAULT_CACHE, 1.0), (2000, 1.0))
#: The scheme of ``FaultyBackend`` (the workloads with faults run on it).
FAULTY: Final = "faultysub"
_TIMEOUT: Final = 5.0  # a reader that makes no progress for this long is a bug

vchannels = st.sampled_from(_VCHANNELS)
pads = st.one_of(st.integers(0, 300), st.just(2500))  # 2500: more than a tiny cache holds
readers = st.integers(0, len(_READ) - 1)
slots = st.integers(0, _SLOTS - 1)
# A writer session: its tail cache, and whether tailing readers open with it (without
# them the cache activates when a reader opens mid-session, maybe with appends in flight,
# and deactivates when the last one closes).
sessions = st.tuples(st.integers(0, len(_CACHES) - 1), st.booleans())

_OPS = (
    st.tuples(st.just("append"), vchannels, pads),
    st.tuples(st.just("many"), st.lists(vchannels, min_size=1, max_size=4), pads),
    st.tuples(st.just("burst"), st.lists(vchannels, min_size=5, max_size=20), pads),
    # A whole transaction: begin, |n| bodies appended concurrently, then commit (n >= 0)
    # or rollback (n < 0).
    st.tuples(st.just("txn"), vchannels, st.integers(-2, 5)),
    # Piecemeal transactions, interleaved with everything else (and left open at
    # restarts: the next writer rolls them back).
    st.tuples(st.just("begin"), slots, vchannels),
    st.tuples(st.just("body"), slots, pads),
    st.tuples(st.just("commit"), slots, st.just(0)),
    st.tuples(st.just("rollback"), slots, st.just(0)),
    st.tuples(st.just("ddl"), vchannels, st.just(0)),
    # The timetick sync, once or twice: it persists a TimeTick if anything was
    # appended since the last one, else publishes an idle tick to waiting readers.
    st.tuples(st.just("sync"), st.integers(1, 2), st.just(0)),
    st.tuples(st.just("advance"), st.integers(1, 3000), st.just(0)),
    st.tuples(st.just("restart"), sessions, st.integers(-5000, 5000)),
    # Pause or resume one live reader (or, for -1, every one).
    st.tuples(st.sampled_from(["pause", "resume"]), st.integers(-1, 20), st.just(0)),
    # Readers opened mid-session, concurrently with the group's appends: from the
    # start, from a delivered message's checkpoint, above a delivered message's tick
    # (timetick_gt), and a subscription that stops after some messages.
    st.tuples(st.just("behind"), readers, st.integers(0, 3)),
    st.tuples(st.just("checkpoint"), readers, st.integers(0, 10_000)),
    st.tuples(st.just("floor"), readers, st.integers(0, 10_000)),
    st.tuples(st.just("subscribe"), readers, st.integers(1, 12)),
)
# The next append (of any op in the group) fails: written but unacknowledged, not
# written, or unavailable and retried (faultysub:// only). The first two reset the
# tail cache.
_FAULT = st.tuples(
    st.just("fault"), st.sampled_from(["lost-ack", "lost-write", "unavailable"]), st.just(0)
)


def workloads(*, faults: bool = False) -> st.SearchStrategy[dict[str, Any]]:
    """One example's workload (``Run`` runs it); with ``faults``, appends fail on command
    (``FAULTY`` only)."""
    ops = st.one_of(*_OPS, *([_FAULT] if faults else []))
    return st.fixed_dictionaries(
        {
            "program": st.lists(ops, min_size=20, max_size=100),
            # How many consecutive operations run concurrently.
            "sizes": st.lists(st.integers(1, 4), min_size=100, max_size=100),
            "session": sessions,
            # Where a subscription reader is closed at a restart: by itself (True) or by
            # the WAL's close (False).
            "close_subscriptions": st.booleans(),
            "picks": st.lists(st.integers(0, 10_000), max_size=3),
        }
    )


class FaultyBackend(_faulty.FaultyBackend):
    """``tests/_faulty.py``'s backend (appends fail on command), with the memory
    backend's subscriptions."""

    scheme = FAULTY

    def subscriptions(self) -> SubscriptionStore:
        return self._inner.subscriptions()


def _register_faulty() -> None:
    if FAULTY not in walsvc.known_schemes():
        module = types.ModuleType("_walsvc_test_scanner_faults")
        module.backend_class = FaultyBackend  # type: ignore[attr-defined]
        sys.modules[module.__name__] = module
        walsvc.register_backend(FAULTY, module.__name__)


_register_faulty()


# ---------------------------------------------------------------------------------------
# Readers under test


def _filters(vchannel: str | None) -> list[walsvc.Filter]:
    return [] if vchannel is None else [scanners.vchannel(vchannel)]


class _Reader:
    """A scanner consumed by a background task into ``got``; ``gate`` pauses it between
    two messages; ``expect`` turns the session's models into what it must deliver."""

    def __init__(
        self,
        label: str,
        vchannel: str | None,
        scanner: walsvc.Scanner,
        expect: Callable[[list[ImmutableMessage]], list[ImmutableMessage]] | None,
        *,
        ack: bool = False,
        limit: int | None = None,
    ) -> None:
        self.label = label
        self.vchannel = vchannel
        self.scanner = scanner
        self.expect = expect
        self.ack = ack
        self.limit = limit
        self.got: list[ImmutableMessage] = []
        self.persisted = 0
        self.wal_closed = False
        self.gate = asyncio.Event()
        self.gate.set()
        self.progress = asyncio.Event()
        self.task = asyncio.ensure_future(self._consume())

    async def _consume(self) -> None:
        try:
            async for m in self.scanner:
                if self.ack:
                    try:
                        await self.scanner.ack(m)
                    except walsvc.WALClosed:
                        # Delivered just before a restart closed the scanner: not acked,
                        # so the subscription delivers it again; it does not count.
                        self.wal_closed = True
                        return
                self.got.append(m)
                self.persisted += m.persisted
                self.progress.set()
                if self.limit is not None and len(self.got) >= self.limit:
                    await self.scanner.aclose()
                    return
                await self.gate.wait()
        except walsvc.WALClosed:
            self.wal_closed = True
        finally:
            self.progress.set()

    async def wait_for(self, count: int) -> None:
        """Until ``count`` persisted messages arrived (or the reader ended)."""
        while self.persisted < count and not self.task.done():
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), _TIMEOUT)
            except TimeoutError:
                raise AssertionError(
                    f"{self.label}: no progress for {_TIMEOUT} s after {self.persisted} of"
                    f" {count} messages; stats {self.scanner.stats()}"
                ) from None

    async def close(self, tally: collections.Counter[str]) -> None:
        self.gate.set()
        await self.scanner.aclose()
        await self.task
        stats = self.scanner.stats()
        tally["handoffs"] += stats.handoffs
        tally["fallbacks"] += stats.fallbacks
        tally["readers"] += 1
        assert stats.rejected == 0, (self.label, stats)
        ticks = [m.timetick for m in self.got]
        assert all(a < b for a, b in itertools.pairwise(ticks)), (self.label, ticks)


# ---------------------------------------------------------------------------------------
# The workload


class Run:
    """One example: the workload, its readers, and the checks at each session's end."""

    def __init__(self, url: str, workload: dict[str, Any], tally: collections.Counter[str]) -> None:
        self.url = url
        self.workload = workload
        self.tally = tally
        self.clock = FakeClock()
        self.wal: walsvc.WAL | None = None
        self.txns: dict[int, walsvc.Txn] = {}
        self.readers: list[_Reader] = []
        self.subscribers: dict[str | None, _Reader] = {}
        #: Per vchannel read: what its subscription's readers delivered, concatenated.
        self.subscribed: dict[str | None, list[ImmutableMessage]] = {v: [] for v in _READ}
        #: Per vchannel read: every message a reader of it delivered (checkpoint picks).
        self.delivered: dict[str | None, list[ImmutableMessage]] = {v: [] for v in _READ}
        self.counter = 0

    def _payload(self, pad: int) -> bytes:
        self.counter += 1
        return b"%d:" % self.counter + b"x" * pad

    async def _open(self, cache: int) -> walsvc.WAL:
        max_bytes, max_age = _CACHES[cache]
        return await open_manual(
            self.url,
            self.clock,
            pchannel="p",
            tail_cache_bytes=max_bytes,
            tail_cache_age=max_age,
        )

    async def _start_session(self, session: tuple[int, bool]) -> walsvc.WAL:
        cache, tailing = session
        wal = self.wal = await self._open(cache)
        self.txns.clear()
        if tailing:
            expect = after_id(await wal.latest_message_id())
            for v in _READ:
                scanner = wal.read(DeliverPolicy.latest(), _filters(v), timeticks=True)
                self.readers.append(_Reader(f"tailing {v}", v, scanner, expect))
        return wal

    async def _op(self, op: str, a: Any, b: Any) -> None:
        wal = self.wal
        assert wal is not None
        try:
            if op == "append":
                await wal.append(Message(payload=self._payload(b), vchannel=a))
            elif op in ("many", "burst"):
                await wal.append_many([Message(payload=self._payload(b), vchannel=v) for v in a])
            elif op == "txn":
                txn = await wal.begin_txn(a, keepalive=2.0)
                bodies = [Message(payload=self._payload(7), vchannel=a) for _ in range(abs(b))]
                await asyncio.gather(*map(txn.append, bodies))
                await (txn.commit() if b >= 0 else txn.rollback())
            elif op == "begin":
                self.txns[a] = await wal.begin_txn(b, keepalive=2.0)
            elif op in ("body", "commit", "rollback") and a in self.txns:
                txn = self.txns[a]
                if op == "body":
                    await txn.append(Message(payload=self._payload(b), vchannel=txn.vchannel))
                elif op == "commit":
                    await txn.commit()
                else:
                    await txn.rollback()
            elif op == "ddl":
                await wal.append(
                    Message(payload=b"", vchannel=a, type=MessageType.CREATE_PARTITION)
                )
        except (walsvc.TxnError, walsvc.WALClosed, walsvc.AppendOutcomeUnknown):
            pass  # expired, aborted, ended, closed or lost: the readers must still hold up

    async def _open_reader(self, op: str, which: int, arg: int) -> None:
        for _ in range(arg % 4):  # let the group's appends get under way
            await asyncio.sleep(0)
        wal = self.wal
        assert wal is not None
        v = _READ[which]
        seen = self.delivered[v]
        if op == "behind":
            scanner = wal.read(DeliverPolicy.all(), _filters(v), timeticks=True)
            self.readers.append(_Reader(f"behind {v}", v, scanner, lambda model: model))
        elif op == "floor" and seen:
            m = seen[arg % len(seen)]
            filters = [*_filters(v), scanners.timetick_gt(m.timetick)]
            scanner = wal.read(DeliverPolicy.all(), filters, timeticks=True)
            label = f"timetick_gt({m.timetick}) {v}"
            self.readers.append(_Reader(label, v, scanner, after_tick(m.timetick)))
        elif op == "checkpoint" and seen:
            m = seen[arg % len(seen)]
            scanner = wal.read(
                DeliverPolicy.from_checkpoint(m.checkpoint), _filters(v), timeticks=True
            )
            label = f"from {m.checkpoint} {v}"
            self.readers.append(_Reader(label, v, scanner, after(m)))
        elif op == "subscribe":
            current = self.subscribers.get(v)
            if current is not None and not current.task.done():
                return  # one scanner per subscription at a time
            if current is not None:
                self._subscriber_done(current)
            scanner = wal.read(
                DeliverPolicy.all(), _filters(v), subscription=f"s-{v}", timeticks=True
            )
            self.subscribers[v] = _Reader(
                f"subscription {v}", v, scanner, None, ack=True, limit=arg
            )

    def _subscriber_done(self, reader: _Reader) -> None:
        assert reader.task.done()
        self.subscribed[reader.vchannel] += reader.got
        self.delivered[reader.vchannel] += reader.got
        del self.subscribers[reader.vchannel]

    def _pause(self, op: str, which: int) -> None:
        live = [r for r in self.readers if not r.task.done()]
        if not live:
            return
        for reader in live if which < 0 else [live[which % len(live)]]:
            if op == "pause":
                reader.gate.clear()
            else:
                reader.gate.set()

    def _count(self, got: Sequence[ImmutableMessage]) -> None:
        self.tally["compared"] += len(got)
        self.tally["txn messages"] += sum(m.type is MessageType.TXN for m in got)
        self.tally["idle ticks"] += sum(not m.persisted for m in got)

    async def _end_session(self, restart: bool) -> None:
        """Compare every reader of this session with the model of the log as it is now."""
        assert self.wal is not None
        cache = self.wal.cache_stats()
        self.tally["cache resets"] += 0 if cache is None else cache.resets
        log = await whole_log(self.url, "p")
        log_order_checks(log)
        models = {v: model(log, v) for v in _READ}
        for reader in self.readers:
            reader.gate.set()
        for reader in self.readers:
            assert reader.expect is not None
            expected = reader.expect(models[reader.vchannel])
            await reader.wait_for(len(expected))
            await reader.close(self.tally)
            assert not reader.wal_closed, reader.label
            assert keys(reader.got) == keys(expected), reader.label
            self.delivered[reader.vchannel] += reader.got
            self._count(reader.got)
        self.readers.clear()
        close_subscriptions = self.workload["close_subscriptions"] or not restart
        for v, reader in list(self.subscribers.items()):
            reader.gate.set()
            if close_subscriptions:
                await reader.close(self.tally)
            else:
                # The restart closes it (and flushes its checkpoint).
                assert self.wal is not None
                await self.wal.aclose()
                await reader.task
            self._subscriber_done(reader)
            got = keys(self.subscribed[v])
            assert got == keys(models[v])[: len(got)], f"subscription {v}"

    async def run(self) -> None:
        program: list[tuple[str, Any, Any]] = self.workload["program"]
        wal = await self._start_session(self.workload["session"])
        position = 0
        for size in self.workload["sizes"]:
            batch = program[position : position + size]
            position += size
            if not batch:
                break
            concurrent: list[asyncio.Future[None]] = []
            for op, a, b in batch:
                if op == "advance":
                    self.clock.ms += a
                elif op == "sync":
                    sync = next(m for m in wal.interceptors if isinstance(m, TimetickSync))
                    for _ in range(a):
                        await asyncio.sleep(0)  # let caught-up readers wait
                        try:
                            await sync.sync_once()
                        except (walsvc.AppendOutcomeUnknown, walsvc.BackendUnavailable):
                            pass  # an injected fault hit the TimeTick (not retried)
                elif op == "fault":
                    FaultyBackend.faults["p"] = [a]
                elif op in ("pause", "resume"):
                    self._pause(op, a)
                elif op in ("behind", "checkpoint", "floor", "subscribe"):
                    concurrent.append(asyncio.ensure_future(self._open_reader(op, a, b)))
                elif op == "restart":
                    await asyncio.gather(*concurrent)
                    concurrent = []
                    FaultyBackend.faults.pop("p", None)
                    await self._end_session(restart=True)
                    await wal.aclose()
                    self.tally["restarts"] += 1
                    self.clock.ms += b  # the wall clock may step back across a restart
                    wal = await self._start_session(a)
                else:
                    concurrent.append(asyncio.ensure_future(self._op(op, a, b)))
            await asyncio.gather(*concurrent)
            FaultyBackend.faults.pop("p", None)  # a fault no append of the group took
        await self._end_session(restart=True)
        await wal.aclose()
        await self._verify()

    async def _verify(self) -> None:
        """A last writer: every subscription reads to the end (its incarnations together
        deliver the model exactly); readers resume from checkpoints of delivered messages
        (on the writer, and read-only) and deliver the model's suffix."""
        wal = self.wal = await self._open(0)
        try:
            log = await whole_log(self.url, "p")
            models = {v: model(log, v) for v in _READ}
            for v in _READ:
                scanner = wal.read(
                    DeliverPolicy.all(), _filters(v), subscription=f"s-{v}", timeticks=True
                )
                reader = _Reader(f"final subscription {v}", v, scanner, None, ack=True)
                await reader.wait_for(len(keys(models[v])) - len(keys(self.subscribed[v])))
                await reader.close(self.tally)
                got = self.subscribed[v] + reader.got
                assert keys(got) == keys(models[v]), f"subscription {v}"
                self._count(got)
            async with await walsvc.open_wal(self.url, "p", read_only=True) as ro:
                for i, pick in enumerate(self.workload["picks"]):
                    v = _READ[pick % len(_READ)]
                    picks = self.delivered[v]
                    if not picks:
                        continue
                    m = picks[pick % len(picks)]
                    policy = DeliverPolicy.from_checkpoint(m.checkpoint)
                    scanner = (wal if i % 2 else ro).read(policy, _filters(v), timeticks=True)
                    expected = after(m)(models[v])
                    reader = _Reader(f"final checkpoint {v}", v, scanner, None)
                    await reader.wait_for(len(expected))
                    await reader.close(self.tally)
                    assert keys(reader.got) == keys(expected), reader.label
                    self._count(reader.got)
        finally:
            await wal.aclose()


# ---------------------------------------------------------------------------------------
# What the tests run it with


#: The event loops a property test runs its examples on, by name (its parameter).
LOOPS: Final[dict[str, Callable[[], asyncio.AbstractEventLoop]]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def run_on(loop: str, main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on a fresh event loop of the kind ``loop`` names."""
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(main)


def check_over_the_run(tally: collections.Counter[str]) -> None:
    # Per example, whether a reader hands off or falls back, sees a committed transaction
    # or an idle tick depends on the workload and on timing; over the run, every one of
    # these paths must have been taken (each is taken in about half the examples or more).
    for path in ("handoffs", "fallbacks", "txn messages", "idle ticks"):
        assert tally[path] >= 1, (path, tally)


#: The property tests' hypothesis settings (each adds its ``max_examples``): an example
#: runs a whole workload, which hypothesis would call too slow.
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow])
