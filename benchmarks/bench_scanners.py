"""The scanner pipeline (issue 4): replaying a file WAL with a vchannel filter, tailing a
writer's tail cache with one reader and with 64, and what the cache's byte accounting
claims against what its entries really hold.

Replay (``FileReplay*``): a file WAL written through the default interceptor chain (so
the log holds the opening TimeTick and the timetick sync's TimeTicks, broadcasts every
vchannel filter admits), 400k messages of 100 bytes over 16 vchannels round robin, built
once per asv run by ``setup_cache``. A read-only WAL replays it from the start with
``WAL.read(filters=[scanners.vchannel("v3")])``: the whole pipeline (log source with the
header-only filter, reorder, transaction and timetick-floor stages) until every "v3"
message and every TimeTick arrived. The figure is records examined (every record in the
log) per second; the baseline is bench_scan's: read everything unfiltered and keep "v3"
in Python (``_common.decode_all_scan``).

Tailing (``TailCache*``): a writer on ``memory://`` (the default chain, or a bare
``interceptors=[]`` WAL), its readers opened with ``DeliverPolicy.latest()`` before
anything is appended (so they start in the tail cache), then 200k messages appended with
``append_many`` in batches of 1000, then the readers drain them with
``scanner.batches()``. Appending first and draining after isolates the reader: the timed
section runs only the reader's code (memory appends do not yield to the loop, so a reader
running concurrently would run only where the writer yields, between its batches, and
would pay one extra waiter future and wake-up per 1000 messages). The consumer reads each
message's timetick and yields to the loop after each batch, as a consumer doing I/O
would: that is what lets 64 readers interleave batch by batch. Every run checks that
each reader read the cache throughout (``stats().source == "cache"``, no hand-off, no
fallback, nothing evicted) and fails otherwise. The cache is sized at 256 MiB: 200k
entries are accounted at about 68 MB, above the 64 MiB default.

Targets (issue 4):
- replay with a vchannel filter >= 1.5M records examined/s;
- tailing from the cache >= 500k msgs/s delivered to one reader on ``memory://``
  (baseline: iterating the same messages in a Python list, the floor of any reader);
- 64 tailing readers cost <= 2x one reader's CPU per delivered message.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import time
import timeit
import tracemalloc
from collections.abc import Sequence
from typing import Any

import scanners
import walsvc
from walsvc import DeliverPolicy, ImmutableMessage, Message, MessageId, Scanner

from ._common import (
    LOOPS,
    PAYLOAD,
    STALL_SECONDS,
    VCHANNELS,
    close_loop,
    decode_all_scan,
    new_loop,
    note,
    side_by_side,
)

REPEATS = 3
_names = itertools.count()

# -- replaying a file WAL with a vchannel filter ------------------------------------------

REPLAY_RECORDS = 400_000
#: append_many batch used to build the log; a multiple of 16 keeps the round robin exact.
BUILD_BATCH = 800
WANTED = "v3"


async def build_replay_log(directory: str) -> tuple[int, int, int]:
    """Append REPLAY_RECORDS messages (vchannel ``v{i % 16}`` for the i-th) through the
    default chain; return the log's (records, "v3" messages, broadcasts), counted by a
    raw read of the whole log."""
    url = f"file://{directory}"
    batch = [Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(BUILD_BATCH)]
    async with await walsvc.open_wal(url, "p0", sync="none") as wal:
        for _ in range(REPLAY_RECORDS // BUILD_BATCH):
            await wal.append_many(batch)
    records = wanted = broadcasts = 0
    async with await walsvc.open_wal(url, "p0", read_only=True) as wal:
        latest = await wal.latest_message_id()
        assert latest is not None
        async with (
            asyncio.timeout(STALL_SECONDS),
            wal.read(raw=True) as scanner,
            contextlib.aclosing(scanner.batches()) as batches,
        ):
            async for got in batches:
                for m in got:
                    records += 1
                    if m.txn is not None:
                        raise AssertionError(f"unexpected transaction message {m!r}")
                    if m.vchannel == WANTED:
                        wanted += 1
                    elif not m.vchannel:
                        broadcasts += 1
                if got[-1].message_id == latest:
                    break
    if wanted != REPLAY_RECORDS // len(VCHANNELS):
        raise AssertionError(f"the log holds {wanted} messages of {WANTED!r}")
    return records, wanted, broadcasts


async def filtered_replay(wal: walsvc.WAL, log: tuple[int, int, int]) -> float:
    """Records examined per second by ``WAL.read(filters=[scanners.vchannel("v3")])``,
    read until every "v3" message and broadcast arrived (the last record is a TimeTick)."""
    records, wanted, broadcasts = log
    expected = wanted + broadcasts
    start = time.perf_counter()
    seen = 0
    async with (
        asyncio.timeout(STALL_SECONDS),
        wal.read(filters=[scanners.vchannel(WANTED)]) as scanner,
        contextlib.aclosing(scanner.batches()) as batches,
    ):
        async for batch in batches:
            seen += len(batch)
            if seen >= expected:
                break
    elapsed = time.perf_counter() - start
    if seen != expected:
        raise AssertionError(f"filtered replay saw {seen} messages, expected {expected}")
    return records / elapsed


async def decode_all_replay(wal: walsvc.WAL, log: tuple[int, int, int]) -> float:
    """The baseline: every record decoded, "v3" kept in Python; records per second."""
    records, wanted, _ = log
    return await decode_all_scan(wal, records=records, wanted=WANTED, matches=wanted)


class _ReplayLog:
    """Shared: the log built once per asv run, a read-only WAL per benchmark process."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 300

    def setup_cache(self) -> tuple[str, tuple[int, int, int]]:
        # asv runs setup_cache in a fresh temporary directory that it deletes once every
        # benchmark using the cache has run, and runs those benchmarks there too.
        directory = os.path.abspath("replay-wal")
        log = asyncio.run(build_replay_log(directory))
        note(f"replay log: {log[0]} records, {log[1]} of {WANTED!r}, {log[2]} broadcasts")
        return directory, log

    def setup(self, cache: tuple[str, tuple[int, int, int]], loop: str) -> None:
        self.log = cache[1]
        self.loop = new_loop(loop)
        self.wal = self.loop.run_until_complete(
            walsvc.open_wal(f"file://{cache[0]}", "p0", read_only=True)
        )

    def teardown(self, cache: tuple[str, tuple[int, int, int]], loop: str) -> None:
        self.loop.run_until_complete(self.wal.aclose())
        close_loop(self.loop)


class FileReplayRate(_ReplayLog):
    """Absolute replay rates, best of three."""

    unit = "records/s"

    def track_vchannel_filter(self, cache: object, loop: str) -> float:
        """walsvc: the public read with ``scanners.vchannel``, records examined per second
        (target >= 1.5M)."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: filtered_replay(self.wal, self.log))
        return max(rates)

    def track_decode_all(self, cache: object, loop: str) -> float:
        """Baseline: no filter, every record decoded, filtered in Python."""
        (rates,) = side_by_side(self.loop, REPEATS, lambda: decode_all_replay(self.wal, self.log))
        return max(rates)


class FileReplayRatio(_ReplayLog):
    """Filtered replay over the decode-everything baseline, alternately, best of three."""

    unit = "ratio"

    def track_vchannel_filter_vs_decode_all_ratio(self, cache: object, loop: str) -> float:
        full, filtered = side_by_side(
            self.loop,
            REPEATS,
            lambda: decode_all_replay(self.wal, self.log),
            lambda: filtered_replay(self.wal, self.log),
        )
        note(f"decode-all {[round(r) for r in full]} filtered {[round(r) for r in filtered]}")
        return max(filtered) / max(full)


# -- tailing the tail cache -----------------------------------------------------------

TAIL_MESSAGES = 200_000
APPEND_BATCH = 1000
#: 200k entries are accounted at about 68 MB: above the 64 MiB default, evictions would
#: send the readers to the backend.
TAIL_CACHE_BYTES = 256 << 20
FAN_OUT = 64
CHAINS = ("default", "bare")
#: Passes over the list in the baseline (one pass of 200k takes a few milliseconds).
LIST_PASSES = 5


async def open_writer(chain: str) -> walsvc.WAL:
    """A writer on a fresh ``memory://`` log: the default chain, or ``interceptors=[]``."""
    options: dict[str, Any] = {} if chain == "default" else {"interceptors": []}
    return await walsvc.open_wal(
        f"memory://bench-tail-{next(_names)}",
        "p0",
        tail_cache_bytes=TAIL_CACHE_BYTES,
        **options,
    )


async def close_writer(wal: walsvc.WAL, readers: Sequence[Scanner]) -> None:
    for scanner in readers:
        await scanner.aclose()
    # Memory logs live as long as the process: drop the records.
    last = await wal.latest_message_id()
    if last is not None:
        await wal.truncate(last)
    await wal.aclose()


async def fill(wal: walsvc.WAL, readers: int) -> tuple[list[Scanner], MessageId]:
    """Open ``readers`` scanners at the end of the log (so in the tail cache), then append
    TAIL_MESSAGES messages with ``append_many``; return the scanners and the last id."""
    scanners_ = [wal.read(DeliverPolicy.latest()) for _ in range(readers)]
    batch = [Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16]) for i in range(APPEND_BATCH)]
    last = None
    for _ in range(TAIL_MESSAGES // APPEND_BATCH):
        last = (await wal.append_many(batch))[-1].message_id
    assert last is not None
    return scanners_, last


async def drain(
    scanner: Scanner, last: MessageId, keep: list[Sequence[ImmutableMessage]] | None = None
) -> int:
    """Read until the message ``last`` arrives; return how many messages were delivered.
    The consumer reads each message's timetick and yields to the loop after each batch."""
    delivered = 0
    newest = -1
    async with asyncio.timeout(STALL_SECONDS), contextlib.aclosing(scanner.batches()) as batches:
        async for batch in batches:
            for message in batch:
                newest = message.timetick
            delivered += len(batch)
            if keep is not None:
                keep.append(batch)
            if last <= batch[-1].message_id:
                break
            await asyncio.sleep(0)
    assert newest >= 0
    return delivered


def check_cache_reads(wal: walsvc.WAL, readers: Sequence[Scanner], delivered: int) -> None:
    """Fail unless every reader read the cache throughout and delivered ``delivered``."""
    for scanner in readers:
        stats = scanner.stats()
        if (stats.source, stats.handoffs, stats.fallbacks, stats.rejected) != ("cache", 0, 0, 0):
            raise AssertionError(f"a reader did not read the tail cache throughout: {stats}")
        if stats.delivered != delivered:
            raise AssertionError(f"a reader delivered {stats.delivered}, not {delivered}")
    cache = wal.cache_stats()
    if cache is None or not cache.active or cache.evicted or cache.resets:
        raise AssertionError(f"the tail cache did not keep every message: {cache}")
    if delivered < TAIL_MESSAGES:
        raise AssertionError(f"delivered {delivered} messages, fewer than {TAIL_MESSAGES}")


async def one_reader_rate(chain: str, keep: list[ImmutableMessage]) -> float:
    """Messages per second delivered to one reader draining the tail cache; the messages
    it delivered replace the contents of ``keep`` (for the list baseline)."""
    wal = await open_writer(chain)
    readers: list[Scanner] = []
    try:
        readers, last = await fill(wal, 1)
        batches: list[Sequence[ImmutableMessage]] = []
        gc.collect()
        start = time.perf_counter()
        delivered = await drain(readers[0], last, batches)
        elapsed = time.perf_counter() - start
        check_cache_reads(wal, readers, delivered)
        keep[:] = [m for batch in batches for m in batch]
        return delivered / elapsed
    finally:
        await close_writer(wal, readers)


async def list_rate(messages: Sequence[ImmutableMessage]) -> float:
    """The baseline: the same messages iterated in a list, reading each one's timetick."""
    if not messages:
        raise AssertionError("no messages to iterate: run one_reader_rate first")
    newest = -1
    start = time.perf_counter()
    for _ in range(LIST_PASSES):
        for message in messages:
            newest = message.timetick
    elapsed = time.perf_counter() - start
    assert newest >= 0
    return len(messages) * LIST_PASSES / elapsed


async def cpu_per_message(chain: str, readers: int) -> float:
    """Process CPU seconds per delivered message, ``readers`` readers draining the same
    TAIL_MESSAGES cached messages concurrently (each its own task)."""
    wal = await open_writer(chain)
    scanners_: list[Scanner] = []
    try:
        scanners_, last = await fill(wal, readers)
        # The first and the last reader keep their batches (one list append per batch):
        # both must have been handed the same message objects, not copies.
        first: list[Sequence[ImmutableMessage]] = []
        other: list[Sequence[ImmutableMessage]] = []
        keep: list[list[Sequence[ImmutableMessage]] | None] = [None] * readers
        keep[0] = first
        if readers > 1:
            keep[-1] = other
        gc.collect()
        start = time.process_time()
        counts = await asyncio.gather(
            *(drain(s, last, k) for s, k in zip(scanners_, keep, strict=True))
        )
        cpu = time.process_time() - start
        if len(set(counts)) != 1:
            raise AssertionError(f"readers delivered different counts: {sorted(set(counts))}")
        check_cache_reads(wal, scanners_, counts[0])
        if other and not all(
            a is b
            for a, b in zip(
                (m for batch in first for m in batch),
                (m for batch in other for m in batch),
                strict=True,
            )
        ):
            raise AssertionError("two readers were handed different message objects")
        return cpu / sum(counts)
    finally:
        await close_writer(wal, scanners_)


class _Tail:
    params = (list(LOOPS), list(CHAINS))
    param_names = ("loop", "chain")
    timer = timeit.default_timer
    timeout = 120

    def setup(self, loop: str, chain: str) -> None:
        self.loop = new_loop(loop)

    def teardown(self, loop: str, chain: str) -> None:
        close_loop(self.loop)


class TailCacheRate(_Tail):
    """One reader draining the tail cache, and its baseline, best of three."""

    unit = "msgs/s"

    def track_one_reader(self, loop: str, chain: str) -> float:
        """walsvc: messages delivered per second to one reader (target >= 500k)."""
        keep: list[ImmutableMessage] = []
        (rates,) = side_by_side(self.loop, REPEATS, lambda: one_reader_rate(chain, keep))
        return max(rates)

    def track_list_iteration(self, loop: str, chain: str) -> float:
        """Baseline: iterating the same messages in a Python list."""
        keep: list[ImmutableMessage] = []
        self.loop.run_until_complete(one_reader_rate(chain, keep))
        (rates,) = side_by_side(self.loop, REPEATS, lambda: list_rate(keep))
        return max(rates)


class TailCacheRatio(_Tail):
    """One reader over the list baseline, alternately, best of three each."""

    unit = "ratio"

    def track_one_reader_vs_list_ratio(self, loop: str, chain: str) -> float:
        keep: list[ImmutableMessage] = []
        wal, floor = side_by_side(
            self.loop, REPEATS, lambda: one_reader_rate(chain, keep), lambda: list_rate(keep)
        )
        note(f"reader {[round(r) for r in wal]} list {[round(r) for r in floor]} msgs/s")
        return max(wal) / max(floor)


class TailCacheFanOutCpu(_Tail):
    """Process CPU per delivered message, best (lowest) of three, in nanoseconds."""

    unit = "ns/msg"

    def track_cpu_1_reader(self, loop: str, chain: str) -> float:
        (cpu,) = side_by_side(self.loop, REPEATS, lambda: cpu_per_message(chain, 1))
        return min(cpu) * 1e9

    def track_cpu_64_readers(self, loop: str, chain: str) -> float:
        (cpu,) = side_by_side(self.loop, REPEATS, lambda: cpu_per_message(chain, FAN_OUT))
        return min(cpu) * 1e9


class TailCacheFanOutRatio(_Tail):
    """64 readers' CPU per delivered message over one reader's, alternately, best of
    three each (target <= 2)."""

    unit = "ratio"

    def track_cpu_64_vs_1_reader_ratio(self, loop: str, chain: str) -> float:
        one, many = side_by_side(
            self.loop,
            REPEATS,
            lambda: cpu_per_message(chain, 1),
            lambda: cpu_per_message(chain, FAN_OUT),
        )
        note(
            f"CPU per delivered message: 1 reader {[round(c * 1e9) for c in one]} ns,"
            f" {FAN_OUT} readers {[round(c * 1e9) for c in many]} ns"
        )
        return min(many) / min(one)


# -- the tail cache's byte accounting -------------------------------------------------


async def cache_memory(distinct_payloads: bool) -> tuple[int, int, int, int]:
    """Fill the tail cache of a bare memory WAL with TAIL_MESSAGES messages under
    tracemalloc; return (bytes the cache accounts, bytes freed when its last reader
    closes and it drops its entries, traced growth of the whole fill, entries).

    With ``distinct_payloads`` every message has its own payload object, which only the
    cache keeps alive once appended (the memory backend stores encoded copies); else all
    share one, which the cache's estimate still counts once per entry."""
    wal = await open_writer("bare")
    reader = wal.read(DeliverPolicy.latest())
    try:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tail = PAYLOAD[4:]
            for n in range(0, TAIL_MESSAGES, APPEND_BATCH):
                batch = [
                    Message(
                        payload=_payload(n + i, tail, distinct_payloads), vchannel=VCHANNELS[i % 16]
                    )
                    for i in range(APPEND_BATCH)
                ]
                await wal.append_many(batch)
            del batch
            gc.collect()
            filled = tracemalloc.get_traced_memory()[0]
            stats = wal.cache_stats()
            assert stats is not None
            if (stats.messages, stats.evicted, stats.resets) != (TAIL_MESSAGES, 0, 0):
                raise AssertionError(f"the tail cache did not keep every message: {stats}")
            await reader.aclose()  # the last reader: the cache drops its entries
            gc.collect()
            emptied = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        return stats.bytes, filled - emptied, filled - before, stats.messages
    finally:
        await close_writer(wal, [reader])


def _payload(n: int, tail: bytes, distinct: bool) -> bytes:
    """A new 100-byte payload object (``distinct``), else the shared PAYLOAD."""
    return n.to_bytes(4, "little") + tail if distinct else PAYLOAD


class TailCacheMemory:
    """The tail cache's accounted bytes (``cache_stats().bytes``: payload and vchannel
    lengths plus ``ENTRY_OVERHEAD`` per entry) over the memory tracemalloc sees freed when
    the cache drops its 200k entries; messages with distinct 100-byte payloads. One run:
    memory does not depend on the loop. Honest within 25%: 0.75 <= ratio <= 1.25."""

    unit = "ratio"
    timeout = 120

    def setup(self) -> None:
        self.loop = new_loop("asyncio")

    def teardown(self) -> None:
        close_loop(self.loop)

    def track_cache_bytes_vs_tracemalloc_ratio(self) -> float:
        ratios = {}
        for distinct in (True, False):
            accounted, freed, growth, entries = self.loop.run_until_complete(cache_memory(distinct))
            kind = "distinct" if distinct else "shared"
            ratios[kind] = accounted / freed
            note(
                f"{kind} payloads: accounted {accounted} B ({accounted / entries:.1f}/entry),"
                f" freed {freed} B ({freed / entries:.1f}/entry), whole fill {growth} B;"
                f" accounted/freed {accounted / freed:.3f}"
            )
        return ratios["distinct"]
