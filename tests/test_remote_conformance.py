"""``walsvc.testing.check_backend``'s steps that apply to a WAL served over walsvc://,
against a node in a subprocess (memory:// and file://).

What runs: the read-and-write rounds (concurrent producers, ``append`` and
``append_many``, readers from every deliver policy, ``latest()`` waiting, ids and ticks
increasing across reopens), the read-only reopen, closing (``WALClosed``; scanners
closed by their owner end), truncation, the exactly-once step (keyed appends, batches
and a keyed transaction replayed after a reopen), and the whole scanner battery
(filters, deliver policies, transaction visibility, a durable subscription resumed by a
new client, and the tail-cache hand-off: a reader that starts behind reads the backend,
then the cache, as its ``Scanner.stats().source`` says, which is the node's scanner's,
sent by a node over protocol version 2 as ``StreamStats``). What does not, and why:
- the term check between reopens (reset by the opener below) and the fencing step: the node is the
  pchannel's single writer, so a client's read-write open neither fences an earlier one
  nor gets a new term; terms will come with pchannel assignment (a later slice).
"""

from __future__ import annotations

import uuid
from typing import Any

import walsvc
from walsvc.testing._exactly_once import ExactlyOnceCheck
from walsvc.testing._pchannel_check import PChannelCheck
from walsvc.testing._scanner_conformance import ScannerCheck


def _opener(node: str) -> Any:
    async def open_for(pchannel: str, *, read_only: bool = False, **_: Any) -> walsvc.WAL:
        return await walsvc.open_wal(node, pchannel, read_only=read_only)

    return open_for


async def test_the_applicable_conformance_steps_pass(node: str) -> None:
    async def open_for(pchannel: str, *, read_only: bool = False, **_: Any) -> walsvc.WAL:
        check._last_term = 0  # one writer, the node: reopening keeps its term
        return await walsvc.open_wal(node, pchannel, read_only=read_only)

    check = PChannelCheck(open_for, f"conf-{uuid.uuid4().hex[:8]}", 200, 30.0)
    for round_ in (1, 2, 3):
        async with await check.open(read_only=False) as wal:
            await check.read_and_write(wal, round_)
        async with await check.open(read_only=True) as wal:
            await check.read_only(wal, f"round {round_}, read-only reopen")
    await check.closing()
    await check.truncation()


async def test_the_exactly_once_step_passes(node: str) -> None:
    await ExactlyOnceCheck(_opener(node), f"conf-keys-{uuid.uuid4().hex[:8]}", 30.0).run()


async def test_the_scanner_battery_passes(node: str) -> None:
    """``ScannerCheck.run``: every step, the tail-cache hand-off included."""
    await ScannerCheck(_opener(node), f"conf-scanners-{uuid.uuid4().hex[:8]}", 30.0).run()
