"""A real Pulsar-protocol broker for the Pulsar tests: Pulsar Lite (the ``pulsar-lite`` wheel).

The launcher lives in ``walsvc.testing._pulsar_lite`` (benchmarks use it too); this module
holds the pytest side:

``pulsar_lite_broker(workdir)``: a started broker with its data in ``workdir``, stopped on
exit; the broker keeps its port and data directory across ``stop()``/``start()`` and
``restart()``, and ``pause()``/``resume()`` freeze and thaw it (SIGSTOP/SIGCONT), which
the fault tests rely on. Fixtures ``broker`` (one per test module)
and ``own_broker`` (one per test, to stop and restart), and the helpers the Pulsar test
modules share.
A broker that cannot start FAILS the test with its stderr; it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pulsar
import pytest

import walsvc
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.backends._pulsar import PulsarBackend
from walsvc.testing import _pulsar_lite
from walsvc.testing._pulsar_lite import PulsarLite

_T = TypeVar("_T")

__all__ = (
    "HANG",
    "PulsarLite",
    "backend_of",
    "broker",
    "client_logger",
    "data",
    "in_plain_client",
    "own_broker",
    "pchannel",
    "pulsar_lite_broker",
    "raw_payloads",
    "read_labels",
    "take_data",
)


@contextlib.contextmanager
def pulsar_lite_broker(workdir: Path) -> Iterator[PulsarLite]:
    """A broker started in ``workdir`` (``pytest.fail`` with its stderr if it does not
    accept connections within 20 s), stopped by its pid on exit."""
    try:
        broker = _pulsar_lite.start_pulsar_lite(workdir)
    except _pulsar_lite.PulsarLiteStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarLite]:
    """One Pulsar Lite broker for the module's tests (each test uses fresh pchannels)."""
    with pulsar_lite_broker(tmp_path_factory.mktemp("pulsar-lite")) as started:
        yield started


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[PulsarLite]:
    """A broker of the test's own, which the test may stop and restart."""
    with pulsar_lite_broker(tmp_path) as started:
        yield started


HANG = 60.0  # a guard against hangs, never a timing assertion


def pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:12]}"


def data(label: str, i: int, **properties: str) -> Message:
    return Message(
        payload=f"{label}:{i}".encode(),
        vchannel="v",
        properties={"n": f"{label}:{i}", **properties},
    )


async def read_labels(url: str, pch: str, deliver: DeliverPolicy, count: int) -> list[str]:
    """The ``n`` property of the first ``count`` data messages a fresh read-only WAL
    delivers from ``deliver``, then checks that nothing more arrives for a moment."""
    out: list[str] = []
    async with await walsvc.open_wal(url, pch, read_only=True) as wal:
        async with wal.read(deliver, raw=True, use_cache=False) as scanner:
            async with asyncio.timeout(HANG):
                while len(out) < count:
                    message = await anext(scanner)
                    if message.type is MessageType.INSERT:
                        out.append(message.properties["n"])
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    while True:
                        message = await anext(scanner)
                        if message.type is MessageType.INSERT:
                            out.append(message.properties["n"])
    return out


async def in_plain_client(url: str, work: Callable[[pulsar.Client], _T]) -> _T:
    """``work(client)`` in a worker thread, with a plain (synchronous) pulsar-client
    client of ``url`` that is closed after it (within ``HANG`` seconds)."""

    def run() -> _T:
        client = pulsar.Client(url, logger=client_logger())
        try:
            return work(client)
        finally:
            client.close()

    async with asyncio.timeout(HANG):
        return await asyncio.to_thread(run)


async def raw_payloads(url: str, topic: str) -> list[bytes]:
    """Every message's data in ``topic``, read with a plain Pulsar reader."""

    def read(client: pulsar.Client) -> list[bytes]:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        out: list[bytes] = []
        while reader.has_message_available():
            out.append(reader.read_next().data())
        return out

    return await in_plain_client(url, read)


def client_logger() -> pulsar.ConsoleLogger:
    """The logger of the tests' own raw Pulsar clients: the client's C++ console logger,
    errors only. Never a Python logger: the client's I/O threads would need the GIL while
    holding a producer's mutex (the deadlock the backend avoids the same way)."""
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def backend_of(wal: walsvc.WAL) -> PulsarBackend:
    backend = wal._backend
    assert isinstance(backend, PulsarBackend)
    return backend


async def take_data(scanner: walsvc.Scanner, count: int) -> AsyncIterator[walsvc.ImmutableMessage]:
    """The next ``count`` INSERT messages of ``scanner`` (within HANG seconds)."""
    taken = 0
    async with asyncio.timeout(HANG):
        while taken < count:
            message = await anext(scanner)
            if message.type is MessageType.INSERT:
                taken += 1
                yield message
