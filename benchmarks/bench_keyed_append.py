"""Keyed appends against plain ones: the file WAL (``sync="always"``, default chain) with
an idempotency key on every message, as the node gives every remote append (producer id
and sequence, ``walsvc.producer_key``), over the same appends without keys. Both run side
by side in one process, alternately, best of three each, every run on a fresh log.

Targets: 64 producers each awaiting ``append`` of a keyed message >= 0.7x the plain rate,
also once the dedup window is full (every new key evicts the oldest); keyed
``append_many`` batches of 100 close to plain ones.
"""

from __future__ import annotations

import asyncio
import timeit
from collections.abc import Awaitable, Callable
from typing import Any

import walsvc
from walsvc import Message

from ._common import (
    LOOPS,
    PAYLOAD,
    PRODUCERS,
    REPEATS,
    VCHANNELS,
    close_loop,
    closed_loop_rate,
    new_loop,
    note,
    remove_dir,
    scratch_dir,
    side_by_side,
)

#: Measured seconds of one closed-loop run, after WARMUP seconds on the same log.
SECONDS = 0.5
WARMUP = 0.1
#: The append_many figures: this many producers, each appending batches of BATCH.
BATCH_PRODUCERS = 4
BATCH = 100
#: Keys in the window before a full-window run (the default window's bound).
FULL_WINDOW = 100_000
#: Never wait forever on a WAL that stopped acking.
STALL_SECONDS = 60


async def append_rate(producers: int, batch: int, *, keyed: bool, window: int = 0) -> float:
    """Messages/s of ``producers`` coroutines appending to a fresh file WAL: one ``append``
    per call if ``batch`` is 1, else ``append_many`` of ``batch`` messages; each message
    with a key of its own if ``keyed`` (built in the call, as a caller would), after
    ``window`` keys were appended first (in batches of 1000, not timed)."""
    directory = scratch_dir("keyed-append")
    try:
        wal = await walsvc.open_wal(f"file://{directory}", "p0", sync="always")
        try:
            for start in range(0, window, 1000):
                await wal.append_many(
                    Message(payload=PAYLOAD, vchannel="v0", idempotency_key=f"fill#{n}")
                    for n in range(start, min(window, start + 1000))
                )
            sent = [0] * producers  # each producer's next sequence number
            producer_ids = [f"producer-{i}" for i in range(producers)]

            def message(i: int) -> Message:
                if not keyed:
                    return Message(payload=PAYLOAD, vchannel=VCHANNELS[i % 16])
                sequence = sent[i]
                sent[i] = sequence + 1
                return Message(
                    payload=PAYLOAD,
                    vchannel=VCHANNELS[i % 16],
                    idempotency_key=walsvc.producer_key(producer_ids[i], sequence),
                )

            def append_one(i: int) -> Awaitable[Any]:
                return wal.append(message(i))

            def append_batch(i: int) -> Awaitable[Any]:
                return wal.append_many([message(i) for _ in range(batch)])

            operation = append_one if batch == 1 else append_batch
            async with asyncio.timeout(STALL_SECONDS):
                await closed_loop_rate(
                    operation, producers=producers, seconds=WARMUP, items_per_call=batch
                )
                return await closed_loop_rate(
                    operation, producers=producers, seconds=SECONDS, items_per_call=batch
                )
        finally:
            await wal.aclose()
    finally:
        remove_dir(directory)


def keyed_vs_plain(
    loop: asyncio.AbstractEventLoop, what: str, producers: int, batch: int, window: int = 0
) -> tuple[float, float]:
    """The best plain and keyed rates of ``REPEATS`` runs each, alternately."""
    plain, keyed = side_by_side(
        loop,
        REPEATS,
        lambda: append_rate(producers, batch, keyed=False),
        lambda: append_rate(producers, batch, keyed=True, window=window),
    )
    note(f"{what}: plain {[round(r) for r in plain]} keyed {[round(r) for r in keyed]} msgs/s")
    return max(plain), max(keyed)


def keyed_figures(
    loop_kind: str = "uvloop", which: str = "single,full_window,many_100"
) -> dict[str, float]:
    """For ``benchmarks.ab``: the keyed and plain rates and their ratio, 64 producers on a
    fresh window (``single``) and on a full one (``full_window``), and 4 producers'
    batches of 100 (``many_100``); ``which`` names the cases, comma-separated."""
    loop = new_loop(loop_kind)
    try:
        figures: dict[str, float] = {}
        cases: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("single", lambda: keyed_vs_plain(loop, "single", PRODUCERS, 1)),
            ("full_window", lambda: keyed_vs_plain(loop, "full", PRODUCERS, 1, FULL_WINDOW)),
            ("many_100", lambda: keyed_vs_plain(loop, "many", BATCH_PRODUCERS, BATCH)),
        ]
        for name, measure in cases:
            if name not in which.split(","):
                continue
            plain, keyed = measure()
            figures[f"{name}_plain_rate"] = plain
            figures[f"{name}_keyed_rate"] = keyed
            figures[f"{name}_keyed_vs_plain_rate"] = keyed / plain
        return figures
    finally:
        close_loop(loop)


class _KeyedAppend:
    """Shared set-up: a fresh event loop per benchmark process."""

    params = (list(LOOPS),)
    param_names = ("loop",)
    timer = timeit.default_timer
    timeout = 300

    def setup(self, loop: str) -> None:
        self.loop = new_loop(loop)

    def teardown(self, loop: str) -> None:
        close_loop(self.loop)


class KeyedAppendRatio(_KeyedAppend):
    """Keyed over plain, measured alternately in one process, best of three each."""

    unit = "ratio"

    def track_keyed_vs_plain_64_producers_ratio(self, loop: str) -> float:
        """64 producers, one message per append, a fresh window (target >= 0.7)."""
        plain, keyed = keyed_vs_plain(self.loop, "64 producers", PRODUCERS, 1)
        return keyed / plain

    def track_keyed_vs_plain_full_window_ratio(self, loop: str) -> float:
        """The same once the window holds its 100k keys: every keyed append evicts one
        (target >= 0.7)."""
        plain, keyed = keyed_vs_plain(self.loop, "full window", PRODUCERS, 1, FULL_WINDOW)
        return keyed / plain

    def track_keyed_vs_plain_append_many_100_ratio(self, loop: str) -> float:
        """4 producers, ``append_many`` of 100 messages."""
        plain, keyed = keyed_vs_plain(self.loop, "append_many 100", BATCH_PRODUCERS, BATCH)
        return keyed / plain


class KeyedAppendRate(_KeyedAppend):
    """Keyed appends alone, best of three runs."""

    unit = "msgs/s"

    def track_keyed_append_64_producers(self, loop: str) -> float:
        (rates,) = side_by_side(self.loop, REPEATS, lambda: append_rate(PRODUCERS, 1, keyed=True))
        return max(rates)

    def track_keyed_append_many_100(self, loop: str) -> float:
        (rates,) = side_by_side(
            self.loop, REPEATS, lambda: append_rate(BATCH_PRODUCERS, BATCH, keyed=True)
        )
        return max(rates)
