"""``LocalWAL.submit`` and ``submit_group``: appends started without a coroutine of the
caller's (what the node does with the appends of one frame). A group's messages are
independent appends: each gets its own outcome, and they join the batch of the loop turn
like appends made one by one."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from pathlib import Path

import _faulty
from _chain_support import whole_log

import walsvc
from interceptors import default_chain
from walsvc import AppendResult, Message, MessageTooLarge, MessageType
from walsvc.core._chain import AppendBatchNext, AppendNext
from walsvc.wal._wal import LocalWAL


class Holdable:
    """A pass-through interceptor (innermost) that, while ``held``, holds appends until
    ``release`` is set (``holding`` is set once it holds one)."""

    def __init__(self) -> None:
        self.held = False
        self.release = asyncio.Event()
        self.holding = asyncio.Event()  # set once it holds an append

    async def _wait(self) -> None:
        if self.held:
            self.holding.set()
            await self.release.wait()

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        await self._wait()
        return await call_next(message)

    async def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        await self._wait()
        return await call_next(messages)


def plain(n: int, size: int = 10) -> Message:
    return Message(payload=n.to_bytes(4, "big") * (size // 4), vchannel="v")


def keyed(n: int, key: str) -> Message:
    return Message(payload=n.to_bytes(4, "big"), vchannel="v", idempotency_key=key)


async def open_file(path: Path, gate: Holdable | None = None, **options: object) -> LocalWAL:
    chain = default_chain(sync_interval=None)
    if gate is not None:
        chain.append(gate)
    wal = await walsvc.open_wal(f"file://{path}", "p0", interceptors=chain, **options)
    assert isinstance(wal, LocalWAL)
    await wal.wait_ready()
    return wal


async def payloads(path: Path) -> list[bytes]:
    stored = await whole_log(f"file://{path}", "p0")
    return [m.payload for m in stored if m.type is not MessageType.TIME_TICK]


async def test_a_group_lands_in_order_with_the_appends_of_its_turn(tmp_path: Path) -> None:
    wal = await open_file(tmp_path)
    try:
        before = wal.submit(plain(0))
        group = wal.submit_group([plain(n) for n in range(1, 6)])
        after = asyncio.ensure_future(wal.append(plain(6)))
        results = [await before, *await group, await after]
    finally:
        await wal.aclose()
    assert all(isinstance(r, AppendResult) for r in results)
    ids = [r.message_id for r in results if isinstance(r, AppendResult)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 7
    assert await payloads(tmp_path) == [plain(n).payload for n in range(7)]


async def test_only_the_oversized_message_of_a_group_fails(tmp_path: Path) -> None:
    wal = await open_file(tmp_path, max_message_size=4096)
    try:
        outcomes = await wal.submit_group([plain(0), plain(1, 8192), plain(2)])
    finally:
        await wal.aclose()
    assert isinstance(outcomes[0], AppendResult)
    assert isinstance(outcomes[1], MessageTooLarge)
    assert isinstance(outcomes[2], AppendResult)
    assert await payloads(tmp_path) == [plain(0).payload, plain(2).payload]


async def test_a_group_cancelled_before_its_batch_starts_appends_nothing(tmp_path: Path) -> None:
    wal = await open_file(tmp_path)
    try:
        group = wal.submit_group([plain(n) for n in range(3)])
        alone = wal.submit(plain(3))
        group.cancel()
        assert isinstance(await alone, AppendResult)
    finally:
        await wal.aclose()
    assert await payloads(tmp_path) == [plain(3).payload]


async def test_a_keyed_group_waits_for_a_key_in_flight_elsewhere(tmp_path: Path) -> None:
    gate = Holdable()
    wal = await open_file(tmp_path, gate)
    gate.held = True
    first = asyncio.ensure_future(wal.append(keyed(0, "k0")))
    async with asyncio.timeout(10):
        await gate.holding.wait()  # k0's batch is claimed and held below Dedup
        gate.held = False
        group = wal.submit_group([keyed(1, "k1"), keyed(0, "k0"), keyed(2, "k2")])
        await asyncio.sleep(0.01)
        assert not group.done()  # k1 and k2 landed; k0 waits for the first append of it
        gate.release.set()
        outcomes = await group
        first_result = await first
        await wal.aclose()
    assert outcomes[1] == first_result  # the same append, answered twice
    assert all(isinstance(o, AppendResult) for o in outcomes)
    assert sorted(await payloads(tmp_path)) == sorted(keyed(n, "").payload for n in range(3))


async def test_a_mixed_group_gets_one_outcome_per_message(tmp_path: Path) -> None:
    wal = await open_file(tmp_path)
    try:
        system = Message(payload=b"", vchannel="v", type=MessageType.TIME_TICK)
        outcomes = await wal.submit_group([plain(0), keyed(1, "a"), system, keyed(1, "a")])
    finally:
        await wal.aclose()
    assert isinstance(outcomes[0], AppendResult)
    assert isinstance(outcomes[1], AppendResult)
    assert isinstance(outcomes[2], walsvc.InvalidMessage)
    assert outcomes[3] == outcomes[1]
    assert await payloads(tmp_path) == [plain(0).payload, keyed(1, "a").payload]


async def test_an_empty_group_is_answered_at_once(tmp_path: Path) -> None:
    wal = await open_file(tmp_path)
    try:
        assert await wal.submit_group([]) == []
    finally:
        await wal.aclose()


class Picky:
    """An interceptor that admits plain messages at once (``PlainAdmission``) except
    those whose payload is ``b"wait"``, which it passes through ``do_append``."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []  # admitted and not released yet
        self.seen: list[bytes] = []  # passed through do_append

    def admit_plain(self, message: Message) -> bool:
        if message.payload == b"wait":
            return False
        self.taken.append(message.payload)
        return True

    def release_plain(self, message: Message) -> None:
        self.taken.remove(message.payload)

    async def do_append(self, message: Message, call_next: AppendNext) -> AppendResult:
        self.seen.append(message.payload)
        return await call_next(message)


async def test_a_plain_group_on_a_backend_durable_at_once_is_appended_at_once() -> None:
    """On ``memory://`` (each append durable when made) a group of plain messages is
    appended while ``submit_group`` runs, one append each: an oversized message fails
    alone, and from a message the chain does not admit at once on, the rest are appended
    as ``append`` appends each, after the messages before it."""
    url = f"memory://{uuid.uuid4().hex}"
    picky = Picky()
    wal = await walsvc.open_wal(url, "p0", max_message_size=4096, interceptors=[picky])
    assert isinstance(wal, LocalWAL)
    try:
        group = wal.submit_group([plain(0), plain(1, 8192), plain(2)])
        assert group.done()  # no task, no loop turn
        outcomes = group.result()
        assert isinstance(outcomes[0], AppendResult)
        assert isinstance(outcomes[1], MessageTooLarge)
        assert isinstance(outcomes[2], AppendResult)
        waiting = Message(payload=b"wait", vchannel="v")
        rest = await wal.submit_group([plain(3), waiting, plain(4)])
        assert all(isinstance(o, AppendResult) for o in rest)
        assert picky.seen == [b"wait"]
        assert picky.taken == []  # every admission released
    finally:
        await wal.aclose()
    stored = [m.payload for m in await whole_log(url, "p0") if m.type is MessageType.INSERT]
    assert stored[:3] == [plain(n).payload for n in (0, 2, 3)]
    assert sorted(stored[3:]) == sorted([b"wait", plain(4).payload])


async def test_plain_groups_appended_at_once_through_random_faults_keep_each_promise(
    seed: random.Random,
) -> None:
    """Groups of plain messages on ``faultynow://`` (durable when appended, so each
    group is appended while ``submit_group`` runs) while its appends fail at random: a
    write refused, a connection reset before the write, or after it (the outcome
    unknown). Every message answered with a result is in the log once, at that id; one
    refused is not; nothing else is in the log but messages whose outcome is unknown;
    no id twice."""
    _faulty.register()
    pchannel = uuid.uuid4().hex
    kinds = ["ok"] * 6 + ["unavailable", "lost-write", "lost-ack"]
    _faulty.FaultyBackend.faults[pchannel] = [seed.choice(kinds) for _ in range(400)]
    url = f"{_faulty.NOW_SCHEME}://{pchannel}"
    sent: list[tuple[bytes, object]] = []
    try:
        wal = await walsvc.open_wal(url, pchannel, interceptors=[])
        try:
            for group_number in range(60):
                group = [
                    Message(payload=b"%d.%d" % (group_number, i), vchannel="v")
                    for i in range(seed.randint(1, 8))
                ]
                appended = wal.submit_group(group)
                assert appended.done()  # appended while submit_group ran
                outcomes = await appended
                sent += [(m.payload, o) for m, o in zip(group, outcomes, strict=True)]
        finally:
            await wal.aclose()
    finally:
        _faulty.FaultyBackend.faults.pop(pchannel, None)
    stored = [m for m in await whole_log(url, pchannel) if m.type is MessageType.INSERT]
    where = {m.payload: m.message_id for m in stored}
    assert len(where) == len(stored)  # no message twice
    assert len({m.message_id for m in stored}) == len(stored)  # no id twice
    unknown = set()
    for payload, outcome in sent:
        if isinstance(outcome, AppendResult):
            assert where.get(payload) == outcome.message_id
        elif isinstance(outcome, walsvc.AppendOutcomeUnknown):
            unknown.add(payload)
        else:
            assert isinstance(outcome, walsvc.BackendUnavailable), outcome
            assert payload not in where
    acknowledged = {p for p, o in sent if isinstance(o, AppendResult)}
    assert set(where) <= acknowledged | unknown
    assert any(isinstance(o, AppendResult) for _, o in sent)
    assert unknown  # the schedule reached the ambiguous faults
