"""The WALs of a process share one pulsar-client client per Pulsar service and timeouts
(``walsvc.backends._pulsar._clients``), and the client outlives them: walsvc closes none
before exit. Other timeouts get a client of their own, and a forked child makes its
own. What a WAL closes (producers, consumers, readers) is retired: kept alive for the
longest operation timeout of the process's clients and ``RETIRE_SLACK`` more, since a
timer of it may still be queued in its client's I/O thread."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
from _pulsar_lite import PulsarLite, backend_of, broker, data, pchannel

import walsvc
from walsvc import DeliverPolicy
from walsvc.backends._pulsar import _calls, _clients

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


class _Closed:
    """Stands for a closed pulsar-client object (weakly referable)."""


def test_a_retired_object_is_freed_once_its_time_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = _clients._Registry()
    monkeypatch.setattr(_clients, "_registry", registry)
    registry.clients[("pulsar://a:6650", 3, 10000)] = object()  # type: ignore[assignment]
    registry.clients[("pulsar://b:6650", 7, 10000)] = object()  # type: ignore[assignment]
    now = [1000.0]
    monkeypatch.setattr(_clients.time, "monotonic", lambda: now[0])
    first, second = _Closed(), _Closed()
    gone = weakref.ref(first)
    _clients.retire(first)
    del first
    hold = 7 + _clients.RETIRE_SLACK  # the longest operation timeout, and the slack
    now[0] += hold - 0.01
    _clients.retire(second)
    gc.collect()
    assert gone() is not None  # not yet: a timer of it may still come due
    now[0] += 0.02
    third = _Closed()
    _clients.retire(third)  # the next retirement frees what is due
    gc.collect()
    assert gone() is None
    assert sorted(map(id, _clients.retired())) == sorted(map(id, (second, third)))


def test_a_forked_child_never_frees_its_parents_retired_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = _clients._Registry()
    monkeypatch.setattr(_clients, "_registry", registry)
    parents = _Closed()
    _clients.retire(parents)
    parent_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent_pid + 1)  # as in a forked child
    assert _clients.retired() == []
    assert registry.inherited == [parents]


async def test_what_a_wal_closes_is_retired_not_freed(broker: PulsarLite) -> None:
    wal = await walsvc.open_wal(broker.url, pchannel())
    try:
        appended = await wal.append(data("r", 0))
        async with wal.read(DeliverPolicy.all()) as scanner:
            async for message in scanner:
                if message.message_id == appended.message_id:
                    break
    finally:
        await wal.aclose()
    kinds = {type(kept) for kept in _clients.retired()}
    # The WAL's producer, its reader, and the consumers that looked up the log's tail.
    assert {_calls.pulsar_asyncio.Producer, _calls.Reader, _calls.pulsar_asyncio.Consumer} <= kinds
