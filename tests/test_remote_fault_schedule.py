"""The seeded network fault schedule: what an acknowledged append or transaction over
``walsvc://`` survives. Producers of plain appends and producers of transactions (each
under a random deadline, so some are cancelled mid-flight) and a checking consumer reach
a node over ``file://`` through a TCP proxy. A transaction (``begin_txn`` or ``async
with wal.txn``) has body calls (``append``, ``append_many``; one after another or
concurrently, some after a pause), then a commit (some sent while the last body call is
in flight), a rollback or nothing; some have a short keepalive. Each round a schedule
picks, at random moments: resets of every connection; answers held back and then the
connection reset (the calls landed, their answers are lost); both directions held until
the heartbeat gives up on the link; the node out of reach for a while; ``kill -9`` of
the node and a new node on the same log behind the same address. The node's dedup
window holds 64 keys (``--dedup-keys``): resends routinely come after their keys left
it, so exactly-once rests on ``Recall`` and the producer fences. Two durable
subscriptions are read meanwhile, one of every vchannel and one of vchannel "v" alone
(a third of the plain producers write "w"): readers of each, one after another, take a
few messages, acknowledge some and close.

After every round, against the log read back directly: every acknowledged append is in
the log exactly once, at the id its acknowledgement named; an append whose caller gave
up is there at most once; every transaction whose commit was acknowledged is there once,
at its commit's id, with every body message its appends acknowledged, in order, and
nothing else (a commit acknowledged: every body call sent before it was acknowledged);
a transaction rolled back, or whose commit was never sent or was refused, shows nothing;
one whose commit's outcome was not learned (a deadline, ``AppendOutcomeUnknown``) is
wholly there once or wholly absent; no transaction call was
applied twice (the raw log holds each body message at most once and each transaction
ends at most once); the consumer received the log from its start, in order, with no gap
and no duplicate; each subscription reader received a run of its subscription's share of
the log, with no gap and no duplicate, from where the checkpoint was: just after its
predecessor's last ack if that one closed cleanly, else anywhere from where its
predecessor started to just after that ack (an ack lost with a link or a killed node may
be delivered again, a message is never skipped). Plain appends raise nothing (the node
is never out of reach for ``reconnect_timeout``); a transaction call raises only the
errors documented for what a fault can do to it, and which ones did is recorded.
``WALSVC_SOAK=N`` runs N times as many rounds; ``WALSVC_TEST_SEED`` pins the seed of the
first round.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import pytest
from _network_faults import strike_until
from _node_process import RestartableNode
from _stacks import stacks_on_timeout
from _tcp_proxy import TcpProxy

import scanners
import walsvc
from walsvc import DeliverPolicy, Message, MessageType

ROUNDS = 3 * int(os.environ.get("WALSVC_SOAK", "1"))
ROUND_SECONDS = 1.5
PRODUCERS = 12
TXN_PRODUCERS = 4
WINDOW_FLAGS = ("--dedup-keys", "64")

#: What a transaction call may raise under these faults, besides the caller's deadline:
#: a call resent to a node restarted in between (it forgot the transaction) does not know
#: whether it was applied (``AppendOutcomeUnknown``); a first one sent there is refused
#: (``UnknownTxn``: the new node rolled the transaction back); a transaction idle past its
#: keepalive while the link was down expired (``TxnExpired``). A begin is resent and
#: never fails; nothing here aborts a transaction (``TxnAborted``: a failed write, an
#: exclusive message, a closed WAL).
_FAULTED: Final = (walsvc.AppendOutcomeUnknown, walsvc.UnknownTxn, walsvc.TxnExpired)
_TXN_ERRORS: Final[dict[str, tuple[type[walsvc.WALError], ...]]] = {
    "begin": (),
    "body": _FAULTED,
    "commit": _FAULTED,
    "rollback": _FAULTED,
}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RestartableNode]:
    running = RestartableNode(f"file://{tmp_path}", *WINDOW_FLAGS)
    try:
        yield running
    finally:
        running.close()


class _TxnRun:
    """One transaction of a transaction producer: its plan, drawn from ``rng``, and
    what became of it. ``end``: "not begun" (the begin did not answer), "dropped" (a
    body call failed or was given up on, or on purpose: no commit or rollback sent),
    "rolled back" (a rollback was sent), "committed" (acknowledged), "commit refused"
    (the commit failed with a transaction error: not applied) or "commit unknown" (its
    outcome not learned)."""

    def __init__(self, name: bytes, rng: random.Random) -> None:
        self.name = name
        self.keepalive = 0.3 if rng.random() < 0.2 else 10.0
        #: One body call a step: 1 message (``append``) or more (``append_many``).
        self.steps = [rng.choice([1, 1, 2, 3]) for _ in range(rng.randint(1, 4))]
        #: The body calls run concurrently (all answered before the commit).
        self.concurrent = rng.random() < 0.25
        #: Seconds the caller works before each body call and before its end (the
        #: transaction idles: a fault then strikes between calls, not during one).
        self.think = rng.choice([0.0, 0.0, 0.0, 0.0, 0.01, 0.04])
        self.ending = rng.choices(["commit", "rollback", "drop"], [0.7, 0.2, 0.1])[0]
        #: ``async with wal.txn(...)`` (its exit commits) instead of ``begin_txn``.
        self.scoped = self.ending != "drop" and rng.random() < 0.3
        #: The commit is sent while the last body call is in flight (it waits for it).
        self.overlap = self.ending == "commit" and not self.scoped and rng.random() < 0.2
        #: The error of the body call in flight at the commit (``overlap``), if any.
        self.overlapped_error: BaseException | None = None
        self.deadline = rng.choice([0.02, 0.1, 0.5, 30.0, 30.0, 30.0])
        self.txn_id: int | None = None
        self.sent: list[bytes] = []
        #: The acknowledged body messages and their ids.
        self.bodies: dict[bytes, walsvc.MessageId] = {}
        self.end = "not begun"
        self.commit_id: walsvc.MessageId | None = None
        self.phase = "begin"
        #: What ended it: an error's type name, "deadline", or None.
        self.ended_by: str | None = None

    def __repr__(self) -> str:
        return (
            f"<txn {self.name.decode()} id={self.txn_id} {self.end} in {self.phase}"
            f" by {self.ended_by} steps={self.steps} concurrent={self.concurrent}"
            f" scoped={self.scoped} overlap={self.overlap} think={self.think}"
            f" keepalive={self.keepalive}"
            f" overlapped_error={self.overlapped_error!r} acked={len(self.bodies)}"
            f"/{len(self.sent)}>"
        )

    async def run(self, wal: walsvc.WAL, unexpected: list[tuple[_TxnRun, BaseException]]) -> None:
        """Run the plan; errors the phase may raise are recorded, others go to
        ``unexpected``."""
        try:
            async with asyncio.timeout(self.deadline) as deadline:
                await self._run(wal)
        except TimeoutError:
            if not deadline.expired():
                raise
            self.ended_by = "deadline"
        except walsvc.WALError as exc:
            self.ended_by = type(exc).__name__
            if not isinstance(exc, _TXN_ERRORS[self.phase]):
                unexpected.append((self, exc))
            if self.phase == "commit" and not isinstance(exc, walsvc.AppendOutcomeUnknown):
                self.end = "commit refused"
        overlapped = self.overlapped_error
        if overlapped is not None and not isinstance(overlapped, _TXN_ERRORS["body"]):
            unexpected.append((self, overlapped))

    async def _run(self, wal: walsvc.WAL) -> None:
        if self.scoped:
            async with wal.txn("v", keepalive=self.keepalive) as txn:
                self._begun(txn)
                await self._bodies(txn, self.steps)
                await asyncio.sleep(self.think)
                if self.ending == "rollback":
                    self.phase, self.end = "rollback", "rolled back"
                    await txn.rollback()
                else:
                    self.phase, self.end = "commit", "commit unknown"
            if txn.commit_result is not None:  # the block's exit committed it
                self._committed(txn.commit_result)
            return
        txn = await wal.begin_txn("v", keepalive=self.keepalive)
        self._begun(txn)
        if self.overlap:
            await self._bodies(txn, self.steps[:-1])
            await self._commit_overlapping(txn, self.steps[-1])
            return
        await self._bodies(txn, self.steps)
        await asyncio.sleep(self.think)
        if self.ending == "commit":
            self.phase, self.end = "commit", "commit unknown"
            self._committed(await txn.commit())
        elif self.ending == "rollback":
            self.phase, self.end = "rollback", "rolled back"
            await txn.rollback()

    def _begun(self, txn: walsvc.Txn) -> None:
        self.txn_id = txn.txn_id
        self.phase, self.end = "body", "dropped"

    def _committed(self, result: walsvc.AppendResult) -> None:
        self.end = "committed"
        self.commit_id = result.message_id

    async def _commit_overlapping(self, txn: walsvc.Txn, size: int) -> None:
        """A body call of ``size`` messages and, while it is in flight, the commit."""
        await asyncio.sleep(self.think)
        body = asyncio.ensure_future(self._step(txn, size))
        await asyncio.sleep(0)  # the body call is sent
        self.phase, self.end = "commit", "commit unknown"
        try:
            self._committed(await txn.commit())
        finally:
            if self.end != "committed":  # its outcome no longer matters to the caller
                body.cancel()
            await asyncio.wait([body])
            if not body.cancelled():
                self.overlapped_error = body.exception()

    async def _bodies(self, txn: walsvc.Txn, steps: list[int]) -> None:
        if not self.concurrent:
            for size in steps:
                await asyncio.sleep(self.think)
                await self._step(txn, size)
            return
        await asyncio.sleep(self.think)
        answers = await asyncio.gather(
            *(self._step(txn, size) for size in steps), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer

    async def _step(self, txn: walsvc.Txn, size: int) -> None:
        payloads = [self.name + b"/%d" % (len(self.sent) + k) for k in range(size)]
        self.sent += payloads
        messages = [Message(payload=p, vchannel="v") for p in payloads]
        if size == 1:
            results = [await txn.append(messages[0])]
        else:
            results = await txn.append_many(messages)
        self.bodies.update((p, r.message_id) for p, r in zip(payloads, results, strict=True))


def _payloads(messages: Iterable[walsvc.ImmutableMessage]) -> Iterator[bytes]:
    """The payloads readers see: a message's, or a committed transaction's bodies'."""
    for message in messages:
        if message.type is MessageType.TXN:
            yield from (body.payload for body in message.body)
        else:
            yield message.payload


async def _read_through(
    wal: walsvc.WAL, end: walsvc.MessageId, *, raw: bool
) -> list[walsvc.ImmutableMessage]:
    """Every message up to (not including) ``end``, as readers see them or (``raw``) as
    stored."""
    log: list[walsvc.ImmutableMessage] = []
    async with asyncio.timeout(30), wal.read(DeliverPolicy.all(), raw=raw) as scan:
        async for message in scan:
            if message.message_id == end:
                break
            log.append(message)
    return log


def _check_txns(
    context: str,
    runs: list[_TxnRun],
    log: list[walsvc.ImmutableMessage],
    raw: list[walsvc.ImmutableMessage],
) -> None:
    """The transactions the readers see, and the stored log, against what the
    transaction producers were told."""
    by_id = {run.txn_id: run for run in runs if run.txn_id is not None}
    visible = [m for m in log if m.type is MessageType.TXN]
    shown = Counter(m.txn.txn_id for m in visible if m.txn is not None)
    twice = [by_id.get(i, i) for i, n in shown.items() if n > 1]
    assert not twice, f"{context}: a transaction visible twice: {twice[:5]}"
    for message in visible:
        assert message.txn is not None, f"{context}: a TXN without its context: {message}"
        run = by_id.get(message.txn.txn_id)
        assert run is not None, f"{context}: a transaction nobody began: {message}"
        assert run.end in ("committed", "commit unknown"), f"{context}: visible: {run}"
        body = [(b.payload, b.message_id) for b in message.body]
        # every acknowledged body, at its id, in order, and nothing it did not send (only
        # a body call in flight with a commit whose outcome is unknown may be there
        # unacknowledged: the caller gave up on both)
        acked = sorted(run.bodies.items(), key=lambda item: item[1])
        shows = f"{context}: {run} shows {[p for p, _ in body]}"
        assert [(p, i) for p, i in body if p in run.bodies] == acked, shows
        assert {p for p, _ in body} <= set(run.sent), shows
        if run.end == "committed":
            assert message.message_id == run.commit_id, f"{context}: {run} at another id"
    # a commit acknowledged: every body call sent before it was acknowledged
    broken = [
        run
        for run in runs
        if run.end == "committed" and (run.overlapped_error or set(run.sent) != set(run.bodies))
    ]
    assert not broken, f"{context}: committed with a body call not acknowledged: {broken[:5]}"
    lost = [run for run in runs if run.end == "committed" and run.txn_id not in shown]
    assert not lost, f"{context}: committed and not visible: {lost[:5]}"
    # no transaction call applied twice: each body stored once, each transaction ended once
    stored = Counter(m.payload for m in raw if m.txn is not None and m.type not in _TXN_CONTROL)
    again = [p for p, n in stored.items() if n > 1]
    assert not again, f"{context}: a body message stored twice: {again[:5]}"
    ends = Counter(m.txn.txn_id for m in raw if m.txn is not None and m.type in _TXN_ENDS)
    ended_twice = [by_id.get(i, i) for i, n in ends.items() if n > 1]
    assert not ended_twice, f"{context}: a transaction ended twice: {ended_twice[:5]}"


class _Session:
    """One reader of the schedule's subscription, from its ``read`` to its ``aclose``:
    the ids it received, the last one it acknowledged, and whether its ``aclose``
    returned cleanly (the node wrote its last checkpoint) or not (the link or the node
    was lost first, or an ack failed)."""

    def __init__(self) -> None:
        self.received: list[walsvc.MessageId] = []
        self.acked: walsvc.MessageId | None = None
        self.clean = False
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        close = "clean" if self.clean else f"unclean ({self.error!r})"
        return f"_Session({len(self.received)} received, acked {self.acked}, {close})"


def _check_subscription(
    context: str, sessions: list[_Session], log: list[walsvc.ImmutableMessage]
) -> None:
    """Each reader of the subscription against the log: it received a run of the log
    with no gap and no repeat; it started where the checkpoint was: after the last
    message its predecessor acknowledged if that one closed cleanly, else anywhere from
    where its predecessor started to just after its last ack (checkpoints only move
    forward, and an ack lost with the link or the node may be redelivered, never a
    message skipped)."""
    place = {m.message_id: i for i, m in enumerate(log)}
    start = 0  # where the checkpoint may be, at the earliest and at the latest
    latest = 0
    for number, session in enumerate(sessions):
        if not session.received:
            continue
        shown = f"{context}: subscription reader {number} {session}"
        first = place.get(session.received[0])
        assert first is not None, f"{shown} received a message not in the log"
        assert start <= first <= latest, f"{shown} started at {first}, not in [{start}, {latest}]"
        run = [place.get(i) for i in session.received]
        assert run == list(range(first, first + len(run))), f"{shown}: a gap or a repeat"
        after_ack = first if session.acked is None else place[session.acked] + 1
        if session.clean:
            start = latest = after_ack
        else:
            start, latest = first, max(after_ack, first)


_TXN_ENDS: Final = frozenset({MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})
_TXN_CONTROL: Final = _TXN_ENDS | {MessageType.BEGIN_TXN}


async def _round(node: RestartableNode, seed: int, outcomes: Counter[str]) -> None:
    rng = random.Random(seed)
    tcp = TcpProxy.for_url(node.url)
    url = await tcp.start()
    pchannel = f"faults-{seed}"
    acknowledged: dict[bytes, walsvc.MessageId] = {}
    gave_up: set[bytes] = set()
    errors: list[BaseException] = []
    runs: list[_TxnRun] = []
    unexpected: list[tuple[_TxnRun, BaseException]] = []
    options = {"heartbeat": 0.1, "reconnect_timeout": 20.0}
    wals = [await walsvc.open_wal(url, pchannel, **options) for _ in range(3)]
    reader = await walsvc.open_wal(url, pchannel, read_only=True, window_messages=64, **options)
    subscriber = await walsvc.open_wal(url, pchannel, read_only=True, **options)
    seen: list[walsvc.ImmutableMessage] = []
    sessions: list[_Session] = []  # of the subscription of every vchannel
    filtered: list[_Session] = []  # of the subscription of vchannel "v"
    stop = asyncio.Event()

    async def produce(producer: int) -> None:
        wal = wals[producer % len(wals)]
        local = random.Random(seed * 1000 + producer)
        vchannel = "w" if producer % 3 == 2 else "v"  # "v" alone is what the filter keeps
        i = 0
        while not stop.is_set():
            payload = b"%d-%d" % (producer, i)
            i += 1
            try:
                async with asyncio.timeout(local.choice([0.005, 0.05, 0.5, 30.0])) as deadline:
                    if local.random() < 0.2:
                        batch = [payload + b"/%d" % k for k in range(3)]
                        results = await wal.append_many(
                            [Message(payload=p, vchannel=vchannel) for p in batch]
                        )
                        acknowledged.update(
                            (p, r.message_id) for p, r in zip(batch, results, strict=True)
                        )
                    else:
                        result = await wal.append(Message(payload=payload, vchannel=vchannel))
                        acknowledged[payload] = result.message_id
            except TimeoutError:
                if not deadline.expired():
                    raise
                gave_up.add(payload)
            except walsvc.WALError as exc:
                errors.append(exc)

    async def produce_txns(producer: int) -> None:
        wal = wals[producer % len(wals)]
        local = random.Random(seed * 1000 + PRODUCERS + producer)
        number = 0
        while not stop.is_set():
            run = _TxnRun(b"t%d-%d" % (producer, number), local)
            number += 1
            runs.append(run)
            await run.run(wal, unexpected)

    async def consume() -> None:
        async for message in reader.read(DeliverPolicy.all()):
            seen.append(message)  # noqa: PERF401 (seen is watched while it grows)

    async def subscribe(name: str, filters: list[walsvc.Filter], sessions: list[_Session]) -> None:
        """Readers of one subscription, one after another: each takes a few messages,
        acknowledges some of them, and closes."""
        local = random.Random(f"{seed}/{name}")
        while not stop.is_set():
            session = _Session()
            sessions.append(session)
            scanner = subscriber.read(DeliverPolicy.all(), filters, subscription=name)
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(local.uniform(0.02, 0.25)):
                        async for message in scanner:
                            session.received.append(message.message_id)
                            if local.random() < 0.3:
                                await scanner.ack(message)
                                session.acked = message.message_id
                await scanner.aclose()
                session.clean = True
            except walsvc.WALError as exc:
                # SubscriptionBusy: the node has yet to see that the previous reader's
                # connection is gone (held by a fault), and holds the name for it
                session.error = exc
                await scanner.aclose()
                await asyncio.sleep(0.05)

    consumer = asyncio.ensure_future(consume())
    faults = asyncio.ensure_future(
        strike_until(
            stop,
            rng,
            tcp,
            node,
            ["cut", "lose-answers", "half-open", "unreachable", "kill"],
            pause=(0.05, 0.25),
            outage=(0.05, 0.4),
            after_kill="cut",
        )
    )
    producers = asyncio.gather(
        *(produce(p) for p in range(PRODUCERS)),
        *(produce_txns(p) for p in range(TXN_PRODUCERS)),
        subscribe("schedule", [], sessions),
        subscribe("schedule-v", [scanners.vchannel("v")], filtered),
    )
    await asyncio.sleep(ROUND_SECONDS)
    stop.set()
    async with stacks_on_timeout(60, "the schedule's final phase"):
        await producers
        done = await faults
    tcp.release()
    expected = set(acknowledged).union(*(run.bodies for run in runs if run.end == "committed"))
    with contextlib.suppress(TimeoutError):  # checked below, against the log
        async with asyncio.timeout(60):
            # until the consumer received every acknowledged append and transaction
            while not (expected <= set(_payloads(seen)) or consumer.done()):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    consumer.cancel()
    for wal in [*wals, reader, subscriber]:
        await wal.aclose()
    await tcp.aclose()  # from here nothing reaches the node but what it already has
    async with await walsvc.open_wal(node.url, pchannel) as direct:
        end = await direct.append(Message(payload=b"end", vchannel="v"))
        log = await _read_through(direct, end.message_id, raw=False)
        raw = await _read_through(direct, end.message_id, raw=True)
    outcomes.update(f"txn {run.end}" for run in runs)
    outcomes.update(f"{run.phase}: {run.ended_by}" for run in runs if run.ended_by is not None)
    outcomes.update(
        f"overlapped body: {type(run.overlapped_error).__name__}"
        for run in runs
        if run.overlapped_error is not None
    )
    outcomes.update("txn overlapping its commit" for run in runs if run.overlap)
    shown = {m.txn.txn_id for m in log if m.type is MessageType.TXN and m.txn is not None}
    outcomes.update(
        f"commit unknown: {'visible' if run.txn_id in shown else 'absent'}"
        for run in runs
        if run.end == "commit unknown"
    )
    context = f"seed {seed}, faults {done}"
    assert not errors, f"{context}: {errors[:3]}"
    assert not unexpected, f"{context}: {unexpected[:3]}"
    counts = Counter(_payloads(log))
    twice = [p for p, n in counts.items() if n > 1]
    assert not twice, f"{context}: landed twice: {twice[:5]}"
    plain = [m for m in log if m.type is not MessageType.TXN]
    where = {m.payload: m.message_id for m in plain}
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
    _check_txns(context, runs, log, raw)
    outcomes.update(
        "subscriber: clean" if s.clean else f"subscriber: {s.error!r}"[:120]
        for s in sessions + filtered
    )
    outcomes["subscription: received"] += sum(len(s.received) for s in sessions)
    outcomes["subscription v: received"] += sum(len(s.received) for s in filtered)
    _check_subscription(context, sessions, log)
    _check_subscription(f"{context}, vchannel v", filtered, [m for m in log if m.vchannel == "v"])
    # the consumer received every acknowledged append and transaction, and its messages
    # are the log's, in order, from the start: no gap, no repeat
    if consumer.done() and not consumer.cancelled():
        consumer.result()  # the error that ended its stream
    missing = expected - set(_payloads(seen))
    assert not missing, f"{context}: the consumer never received {sorted(missing)[:5]}"
    assert [(m.message_id, m.body) for m in seen] == [
        (m.message_id, m.body) for m in log[: len(seen)]
    ], context


@pytest.mark.slow
async def test_acknowledged_appends_and_transactions_survive_a_seeded_schedule_of_network_faults(
    node: RestartableNode, seed_value: int
) -> None:
    outcomes: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        await _round(node, seed_value + round_, outcomes)
    print(f"seeds {seed_value}..{seed_value + ROUNDS - 1}: {sorted(outcomes.items())}")
    # the schedule checked transactions that committed and ones that rolled back
    assert outcomes["txn committed"], outcomes
    assert outcomes["txn rolled back"], outcomes
    assert outcomes["subscription: received"], outcomes
    assert outcomes["subscription v: received"], outcomes
