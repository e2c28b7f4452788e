"""``walsvc.testing.check_backend``'s steps that apply to a WAL served over walsvc://,
against a node in a subprocess.

What runs: the read-and-write rounds (concurrent producers, ``append`` and
``append_many``, readers from every deliver policy, ``latest()`` waiting, ids and ticks
increasing across reopens), the read-only reopen, and closing (``WALClosed``; scanners
closed by their owner end). What does not yet, and why:
- the term check between reopens (reset below) and the fencing step: the node is the
  pchannel's single writer, so a client's read-write open neither fences an earlier one
  nor gets a new term; terms will come with pchannel assignment (a later slice);
- truncation, the exactly-once step (keyed transactions) and the scanner battery (its
  first step writes transactions; subscriptions and ``ack``): not served yet.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _node_process import node_process

import walsvc
from walsvc.testing._conformance import _PChannelCheck


@pytest.fixture(scope="module", params=["memory", "file"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "memory":
        url = f"memory://conformance-{uuid.uuid4().hex[:8]}"
    else:
        url = f"file://{tmp_path_factory.mktemp('node')}"
    with node_process(url) as (node_url, _):
        yield node_url


async def test_the_applicable_conformance_steps_pass(node: str) -> None:
    async def open_for(pchannel: str, *, read_only: bool = False, **_: Any) -> walsvc.WAL:
        return await walsvc.open_wal(node, pchannel, read_only=read_only)

    check = _PChannelCheck(open_for, f"conf-{uuid.uuid4().hex[:8]}", 200, 30.0)
    for round_ in (1, 2, 3):
        check._last_term = 0  # one writer, the node: reopening keeps its term
        async with await check.open(read_only=False) as wal:
            await check.read_and_write(wal, round_)
        async with await check.open(read_only=True) as wal:
            await check.read_only(wal, f"round {round_}, read-only reopen")
    check._last_term = 0
    await check.closing()
