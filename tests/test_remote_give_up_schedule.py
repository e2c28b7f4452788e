"""The seeded give-up schedule: clients whose ``reconnect_timeout`` (0.3 s) is shorter
than some of the outages a TCP proxy and a node ``kill -9`` make, so connections give up
(what is pending fails) and dial again on the next call (``Connection._redial``), over
and over, while producers and a consumer keep calling.

Plain producers append without keys and never retry; keyed producers give each append
an idempotency key and, on ``AppendOutcomeUnknown`` or ``BackendUnavailable``, append it
again with the same key until it is acknowledged, as the errors tell them to. A consumer
reads from the start and, when its stream fails, reads again right after the last
message it received.

After every round, against the log read back directly: every acknowledged append is in
the log exactly once, at the id its acknowledgement named; an append refused with
``BackendUnavailable`` is not in the log (its caller was told nothing of it was
written); one whose outcome was unknown is there at most once; every keyed append is
there exactly once however often it was retried; nothing is in the log that nobody
appended; the consumer's messages are the log's, in order, from its start, with no gap
and no duplicate. Over the rounds the schedule must have made clients give up (else it
tested nothing here). ``WALSVC_SOAK=N`` runs N times as many rounds;
``WALSVC_TEST_SEED`` pins the seed of the first round.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _network_faults import strike_until
from _node_process import RestartableNode
from _tcp_proxy import TcpProxy

import walsvc
from walsvc import DeliverPolicy, Message

ROUNDS = 3 * int(os.environ.get("WALSVC_SOAK", "1"))
ROUND_SECONDS = 1.5
PLAIN_PRODUCERS = 4
KEYED_PRODUCERS = 4
#: Shorter than the longer outages below, and than a node's restart.
RECONNECT_TIMEOUT = 0.3


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RestartableNode]:
    running = RestartableNode(f"file://{tmp_path}")
    try:
        yield running
    finally:
        running.close()


class _Outcomes:
    """What the producers and the consumer of a round were told."""

    def __init__(self) -> None:
        self.acknowledged: dict[bytes, walsvc.MessageId] = {}
        self.refused: set[bytes] = set()  # BackendUnavailable: nothing was written
        self.unknown: set[bytes] = set()  # AppendOutcomeUnknown
        self.keyed: set[bytes] = set()
        self.seen: list[walsvc.ImmutableMessage] = []
        self.errors: list[BaseException] = []
        self.counts: Counter[str] = Counter()


async def _produce_plain(wal: walsvc.WAL, name: int, told: _Outcomes, stop: asyncio.Event) -> None:
    """Appends (some ``append_many`` of 2) without keys, none retried."""
    local = random.Random(name)
    i = 0
    while not stop.is_set():
        payloads = [b"p%d-%d" % (name, i)]
        i += 1
        if local.random() < 0.25:
            payloads.append(payloads[0] + b"/1")
        messages = [Message(payload=p, vchannel="v") for p in payloads]
        try:
            if len(messages) == 1:
                results = [await wal.append(messages[0])]
            else:
                results = await wal.append_many(messages)
        except walsvc.BackendUnavailable:
            told.refused.update(payloads)
            told.counts["plain: BackendUnavailable"] += 1
            await asyncio.sleep(0.01)
        except walsvc.AppendOutcomeUnknown:
            told.unknown.update(payloads)
            told.counts["plain: AppendOutcomeUnknown"] += 1
        except walsvc.WALError as exc:
            told.errors.append(exc)
        else:
            told.acknowledged.update(zip(payloads, (r.message_id for r in results), strict=True))


async def _produce_keyed(wal: walsvc.WAL, name: int, told: _Outcomes, stop: asyncio.Event) -> None:
    """Appends with idempotency keys, each retried with its key until acknowledged."""
    i = 0
    while not stop.is_set():
        payload = b"k%d-%d" % (name, i)
        i += 1
        told.keyed.add(payload)
        message = Message(payload=payload, vchannel="w", idempotency_key=payload.decode())
        while True:
            try:
                result = await wal.append(message)
            except (walsvc.BackendUnavailable, walsvc.AppendOutcomeUnknown) as exc:
                told.counts[f"keyed: {type(exc).__name__}"] += 1
                await asyncio.sleep(0.01)
            except walsvc.WALError as exc:
                told.errors.append(exc)
                return
            else:
                told.acknowledged[payload] = result.message_id
                break


async def _consume(wal: walsvc.WAL, told: _Outcomes) -> None:
    """Read from the start; after a failed stream, read on right after the last message
    received."""
    deliver = DeliverPolicy.all()
    while True:
        try:
            async for message in wal.read(deliver):
                told.seen.append(message)
                deliver = DeliverPolicy.start_after(message.message_id)
        except walsvc.BackendUnavailable:
            told.counts["consumer: BackendUnavailable"] += 1
            await asyncio.sleep(0.01)


async def _log(node_url: str, pchannel: str) -> list[walsvc.ImmutableMessage]:
    """Every message of ``pchannel``, read straight from the node."""
    async with await walsvc.open_wal(node_url, pchannel) as direct:
        end = (await direct.append(Message(payload=b"end", vchannel="v"))).message_id
        log: list[walsvc.ImmutableMessage] = []
        async with asyncio.timeout(30), direct.read(DeliverPolicy.all()) as scanner:
            async for message in scanner:
                if message.message_id == end:
                    return log
                log.append(message)
    raise AssertionError("unreachable")


async def _round(node: RestartableNode, seed: int, counts: Counter[str]) -> None:
    rng = random.Random(seed)
    tcp = TcpProxy.for_url(node.url)
    url = await tcp.start()
    pchannel = f"give-up-{seed}"
    told = _Outcomes()
    options = {"heartbeat": 0.1, "reconnect_timeout": RECONNECT_TIMEOUT}
    wals = [await walsvc.open_wal(url, pchannel, **options) for _ in range(2)]
    reader = await walsvc.open_wal(url, pchannel, read_only=True, **options)
    stop = asyncio.Event()
    consumer = asyncio.ensure_future(_consume(reader, told))
    faults = asyncio.ensure_future(
        strike_until(
            stop,
            rng,
            tcp,
            node,
            ["cut", "lose-answers", "unreachable", "unreachable", "kill"],
            pause=(0.05, 0.3),
            outage=(0.05, 1.0),  # often past one or two reconnect_timeouts
            after_kill="unreachable",
        )
    )
    producers = asyncio.gather(
        *(_produce_plain(wals[0], seed * 100 + p, told, stop) for p in range(PLAIN_PRODUCERS)),
        *(_produce_keyed(wals[1], seed * 100 + p, told, stop) for p in range(KEYED_PRODUCERS)),
    )
    await asyncio.sleep(ROUND_SECONDS)
    stop.set()
    async with asyncio.timeout(60):
        done = await faults
        await producers
    tcp.release()
    expected = set(told.acknowledged)
    async with asyncio.timeout(60):  # until the consumer received every acknowledged append
        while not expected <= {m.payload for m in told.seen}:
            assert not consumer.done(), consumer
            await asyncio.sleep(0.02)
    consumer.cancel()
    for wal in [*wals, reader]:
        await wal.aclose()
    await tcp.aclose()
    log = await _log(node.url, pchannel)
    context = f"seed {seed}, faults {done}, {sorted(told.counts.items())}"
    assert not told.errors, f"{context}: {told.errors[:3]}"
    landed = Counter(m.payload for m in log)
    twice = [p for p, n in landed.items() if n > 1]
    assert not twice, f"{context}: landed twice: {twice[:5]}"
    where = {m.payload: m.message_id for m in log}
    lost = [p for p in told.acknowledged if p not in where]
    assert not lost, f"{context}: acknowledged and lost: {lost[:5]}"
    moved = [p for p, i in told.acknowledged.items() if where[p] != i]
    assert not moved, f"{context}: acknowledged at another id: {moved[:5]}"
    written = sorted(told.refused & set(where))
    assert not written, f"{context}: refused (BackendUnavailable) yet in the log: {written[:5]}"
    missing = sorted(told.keyed - set(where))
    assert not missing, (
        f"{context}: keyed, retried until acknowledged, not in the log: {missing[:5]}"
    )
    invented = set(where) - set(told.acknowledged) - told.unknown
    assert not invented, f"{context}: in the log, never acknowledged: {sorted(invented)[:5]}"
    assert [m.message_id for m in told.seen] == [m.message_id for m in log[: len(told.seen)]], (
        f"{context}: the consumer's messages are not the log's, in order"
    )
    counts.update(told.counts)
    counts.update(f"fault: {fault}" for fault in done)


@pytest.mark.slow
async def test_acknowledged_appends_survive_clients_that_give_up_and_dial_again(
    node: RestartableNode, seed_value: int
) -> None:
    counts: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        await _round(node, seed_value + round_, counts)
    print(f"seeds {seed_value}..{seed_value + ROUNDS - 1}: {sorted(counts.items())}")
    # the schedule made clients give up: appends refused or of unknown outcome
    gave_up = sum(n for what, n in counts.items() if not what.startswith("fault:"))
    assert gave_up, counts
