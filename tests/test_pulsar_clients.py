"""The WALs of a process share one pulsar-client client per Pulsar service and timeouts
(``walsvc.backends._pulsar._clients``), and the client outlives them: walsvc closes none
before exit. Other timeouts get a client of their own, and a forked child makes its
own."""

from __future__ import annotations

import os

import pytest
from _pulsar_lite import PulsarLite, backend_of, broker, data, pchannel

import walsvc
from walsvc import DeliverPolicy
from walsvc.backends._pulsar import _clients

__all__ = ("broker",)


def _raw(wal: walsvc.WAL) -> object:
    return backend_of(wal).client.raw


async def test_wals_on_one_broker_share_a_client_that_outlives_them(broker: PulsarLite) -> None:
    url = broker.url
    first = await walsvc.open_wal(url, pchannel())
    second = await walsvc.open_wal(url, pchannel())
    reader = await walsvc.open_wal(url, pchannel(), read_only=True)
    count = _clients.shared_clients()
    try:
        assert _raw(first) is _raw(second) is _raw(reader)
        await first.append(data("a", 0))
    finally:
        await first.aclose()
    # The others go on over the client the first one stopped using.
    appended = await second.append(data("b", 0))
    async with second.read(DeliverPolicy.all()) as scanner:
        async for message in scanner:
            if message.message_id == appended.message_id:
                break
    await second.aclose()
    await reader.aclose()
    # The client is kept: a WAL opened now uses it.
    again = await walsvc.open_wal(url, pchannel())
    try:
        assert _raw(again) is _raw(second)
        assert _clients.shared_clients() == count
        await again.append(data("c", 0))
    finally:
        await again.aclose()


async def test_other_timeouts_get_a_client_of_their_own(broker: PulsarLite) -> None:
    url = broker.url
    default = await walsvc.open_wal(url, pchannel())
    patient = await walsvc.open_wal(url, pchannel(), operation_timeout=45.0)
    try:
        assert _raw(default) is not _raw(patient)
        await patient.append(data("p", 0))
    finally:
        await default.aclose()
        await patient.aclose()


def test_a_forked_child_holds_its_parents_clients_but_does_not_use_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _clients._Registry()
    parents = object()
    registry.clients[("pulsar://parent:6650", 30, 10000)] = parents  # type: ignore[assignment]
    parent_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent_pid + 1)  # as in a forked child
    assert registry.live() == {}
    assert registry.inherited == [parents]
    assert registry.pid == parent_pid + 1
