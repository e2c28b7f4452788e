"""The seeded network fault schedule: what an acknowledged append over ``walsvc://``
survives. Producers (each append under a random deadline, so some are cancelled
mid-flight) and a checking consumer reach a node over ``file://`` through a TCP proxy;
each round a schedule picks, at random moments: resets of every connection; answers held
back and then the connection reset (the appends landed, their answers are lost); both
directions held until the heartbeat gives up on the link; the node out of reach for a
while; ``kill -9`` of the node and a new node on the same log behind the same address.

After every round: every acknowledged append is in the log exactly once, at the id its
acknowledgement named; an append whose caller gave up is there at most once; the
consumer received the log from its start, in order, with no gap and no duplicate; every error
raised was a ``walsvc.WALError``. ``WALSVC_SOAK=N`` runs N times as many rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _node_process import node_process
from _tcp_proxy import TcpProxy

import walsvc
from walsvc import DeliverPolicy, Message

ROUNDS = 2 * int(os.environ.get("WALSVC_SOAK", "1"))
ROUND_SECONDS = 1.5
PRODUCERS = 12


class _Node:
    """The node process of the schedule, restartable on the same log."""

    def __init__(self, log_url: str) -> None:
        self.log_url = log_url
        self._stack = contextlib.ExitStack()
        self.url, self.process = self._start()

    def _start(self) -> tuple[str, subprocess.Popen[str]]:
        return self._stack.enter_context(node_process(self.log_url))

    def kill_and_restart(self) -> str:
        self.process.kill()
        self.process.wait()
        self.url, self.process = self._start()
        return self.url

    def close(self) -> None:
        self._stack.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[_Node]:
    running = _Node(f"file://{tmp_path}")
    try:
        yield running
    finally:
        running.close()


async def _faults(rng: random.Random, tcp: TcpProxy, node: _Node, stop: asyncio.Event) -> list[str]:
    """Inject faults at random moments until ``stop``; return what was done."""
    done: list[str] = []
    killed = False
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.05, 0.25))
        fault = rng.choice(["cut", "lose-answers", "half-open", "unreachable", "kill"])
        if fault == "kill" and killed:
            fault = "cut"
        if fault == "cut":
            tcp.cut()
        elif fault == "lose-answers":
            tcp.hold("down")
            await asyncio.sleep(rng.uniform(0.01, 0.1))
            tcp.cut()
        elif fault == "half-open":
            tcp.hold("up", "down")
            await asyncio.sleep(rng.uniform(0.3, 0.6))  # past the clients' heartbeat (0.1 s)
            tcp.release()
        elif fault == "unreachable":
            tcp.refusing = True
            tcp.cut()
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            tcp.refusing = False
        else:
            killed = True
            tcp.hold("down")
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            tcp.refusing = True
            url = await asyncio.to_thread(node.kill_and_restart)
            tcp.cut()
            tcp.retarget(url)
            tcp.refusing = False
        done.append(fault)
    return done


async def _round(node: _Node, seed: int) -> None:
    rng = random.Random(seed)
    tcp = TcpProxy.for_url(node.url)
    url = await tcp.start()
    pchannel = f"faults-{seed}"
    acknowledged: dict[bytes, walsvc.MessageId] = {}
    gave_up: set[bytes] = set()
    errors: list[BaseException] = []
    options = {"heartbeat": 0.1, "reconnect_timeout": 20.0}
    wals = [await walsvc.open_wal(url, pchannel, **options) for _ in range(3)]
    reader = await walsvc.open_wal(url, pchannel, read_only=True, window_messages=64, **options)
    seen: list[walsvc.ImmutableMessage] = []
    stop = asyncio.Event()

    async def produce(producer: int) -> None:
        wal = wals[producer % len(wals)]
        local = random.Random(seed * 1000 + producer)
        i = 0
        while not stop.is_set():
            payload = b"%d-%d" % (producer, i)
            i += 1
            try:
                async with asyncio.timeout(local.choice([0.005, 0.05, 0.5, 30.0])):
                    if local.random() < 0.2:
                        batch = [payload + b"/%d" % k for k in range(3)]
                        results = await wal.append_many(
                            [Message(payload=p, vchannel="v") for p in batch]
                        )
                        acknowledged.update(
                            (p, r.message_id) for p, r in zip(batch, results, strict=True)
                        )
                    else:
                        result = await wal.append(Message(payload=payload, vchannel="v"))
                        acknowledged[payload] = result.message_id
            except TimeoutError:
                gave_up.add(payload)
            except walsvc.WALError as exc:
                errors.append(exc)

    async def consume() -> None:
        async for message in reader.read(DeliverPolicy.all()):
            seen.append(message)  # noqa: PERF401 (seen is watched while it grows)

    consumer = asyncio.ensure_future(consume())
    faults = asyncio.ensure_future(_faults(rng, tcp, node, stop))
    producers = asyncio.gather(*(produce(p) for p in range(PRODUCERS)))
    await asyncio.sleep(ROUND_SECONDS)
    stop.set()
    async with asyncio.timeout(60):
        await producers
        done = await faults
        tcp.release()
        # until the consumer received every acknowledged append
        while not set(acknowledged) <= {m.payload for m in seen}:  # noqa: ASYNC110 (no event)
            await asyncio.sleep(0.02)
    consumer.cancel()
    for wal in [*wals, reader]:
        await wal.aclose()
    await tcp.aclose()  # from here nothing reaches the node but what it already has
    async with await walsvc.open_wal(node.url, pchannel) as direct:
        end = await direct.append(Message(payload=b"end", vchannel="v"))
        log: list[walsvc.ImmutableMessage] = []
        async with asyncio.timeout(30), direct.read(DeliverPolicy.all()) as scan:
            async for message in scan:
                if message.message_id == end.message_id:
                    break
                log.append(message)
    context = f"seed {seed}, faults {done}"
    assert not errors, f"{context}: {errors[:3]}"
    counts = Counter(m.payload for m in log)
    twice = [p for p, n in counts.items() if n > 1]
    assert not twice, f"{context}: landed twice: {twice[:5]}"
    where = {m.payload: m.message_id for m in log}
    lost = [p for p in acknowledged if p not in where]
    assert not lost, f"{context}: acknowledged and lost: {lost[:5]}"
    moved = [p for p, i in acknowledged.items() if where[p] != i]
    assert not moved, f"{context}: acknowledged at another id: {moved[:5]}"
    invented = (
        set(where)
        - set(acknowledged)
        - {p for g in gave_up for p in (g, *(g + b"/%d" % k for k in range(3)))}
    )
    assert not invented, f"{context}: in the log, never appended: {sorted(invented)[:5]}"
    # the consumer's messages are the log's, in order, from the start: no gap, no repeat
    assert [m.message_id for m in seen] == [m.message_id for m in log[: len(seen)]], context


@pytest.mark.slow
async def test_acknowledged_appends_survive_a_seeded_schedule_of_network_faults(
    node: _Node,
) -> None:
    base = random.randrange(1 << 30)
    for round_ in range(ROUNDS):
        await _round(node, base + round_)
