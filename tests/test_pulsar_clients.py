"""The WALs of a process share one pulsar-client client per Pulsar service and timeouts
(``walsvc.backends._pulsar._clients``): the last WAL to close closes it, a WAL opened
after gets a new one, other timeouts get their own, and a forked child makes its own."""

from __future__ import annotations

import os

import pytest
from _pulsar_lite import PulsarLite, backend_of, broker, data, pchannel

import walsvc
from walsvc import DeliverPolicy
from walsvc.backends._pulsar import _clients
from walsvc.backends._pulsar._client import parse_options

__all__ = ("broker",)


def _raw(wal: walsvc.WAL) -> object:
    return backend_of(wal).client.raw


async def test_wals_on_one_broker_share_a_client_until_the_last_closes(broker: PulsarLite) -> None:
    url = broker.url
    before = _clients.shared_clients()
    first = await walsvc.open_wal(url, pchannel())
    second = await walsvc.open_wal(url, pchannel())
    reader = await walsvc.open_wal(url, pchannel(), read_only=True)
    try:
        assert _raw(first) is _raw(second) is _raw(reader)
        assert _clients.shared_clients() == before + 1
        await first.append(data("a", 0))
    finally:
        await first.aclose()
    # The others go on over the client the first one gave back.
    appended = await second.append(data("b", 0))
    async with second.read(DeliverPolicy.all()) as scanner:
        async for message in scanner:
            if message.message_id == appended.message_id:
                break
    await second.aclose()
    await reader.aclose()
    assert _clients.shared_clients() == before
    # The last one out closed it: a WAL opened now makes a new one.
    again = await walsvc.open_wal(url, pchannel())
    try:
        assert _raw(again) is not _raw(second)
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


async def test_a_lease_given_back_twice_counts_once(broker: PulsarLite) -> None:
    location = broker.url.removeprefix("pulsar://")
    before = _clients.shared_clients()
    held = _clients.lease(location, parse_options({}))
    other = _clients.lease(location, parse_options({}))
    await _clients.release(held)
    await _clients.release(held)  # a no-op: ``other`` still holds the client
    assert _clients.shared_clients() == before + 1
    await _clients.release(other)
    assert _clients.shared_clients() == before


async def test_a_forked_child_does_not_use_its_parents_client(
    broker: PulsarLite, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = broker.url.removeprefix("pulsar://")
    parents = _clients.lease(location, parse_options({}))
    try:
        parent_pid = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: parent_pid + 1)  # as in a forked child
        childs = _clients.lease(location, parse_options({}))
        assert childs.raw is not parents.raw
        await _clients.release(childs)
    finally:
        monkeypatch.undo()
        await _clients.release(parents)
