"""A fenced writer learns who fenced it, on the brokers: the record that fences (the new
writer's barrier) names its writer's pid and host (a Kafka header, a Pulsar property),
and the fenced writer's ``WALFenced`` repeats it. Best effort: a barrier without that
name (an older writer's) still fences, and the error is as before, without a name."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pulsar.asyncio as pulsar_asyncio
import pytest
from _pulsar_lite import HANG as PULSAR_HANG
from _pulsar_lite import PulsarLite, backend_of, broker, client_logger, data, pchannel
from _tansu import HANG as KAFKA_HANG
from _tansu import fresh, servers, tansu_url
from aiokafka import AIOKafkaProducer

import walsvc
import walsvc.backends._pulsar._writer
from walsvc import Message, WALFenced
from walsvc.backends._pulsar._sender import Fenced

# Fixtures imported from the helper modules (pytest finds them by name here).
__all__ = ("broker", "tansu_url")

THIS_WRITER = f"pid {os.getpid()} on {socket.gethostname()}"


def _message(label: str) -> Message:
    return Message(payload=label.encode(), vchannel="v")


def _assert_names_this_process(error: WALFenced) -> None:
    text = str(error)
    assert f"({THIS_WRITER}" in text, text
    assert "read_only=True" in text, text


def _assert_names_nobody(error: WALFenced) -> None:
    text = str(error)
    assert " pid " not in text, text
    assert "fenced by a writer with term" in text, text


# -- kafka:// -----------------------------------------------------------------------------


async def test_a_kafka_writer_fenced_by_another_open_is_told_its_pid_and_host(
    tansu_url: str,
) -> None:
    pch = fresh()
    async with asyncio.timeout(KAFKA_HANG), await walsvc.open_wal(tansu_url, pch) as old:
        await old.append(_message("mine"))
        async with await walsvc.open_wal(tansu_url, pch) as new:
            with pytest.raises(WALFenced) as raised:
                await old.append(_message("late"))
            _assert_names_this_process(raised.value)
            assert f"term {old.term} was fenced by a writer with term {new.term}" in str(
                raised.value
            )
            with pytest.raises(WALFenced) as again:  # fenced for good, and still named
                await old.append(_message("later"))
            _assert_names_this_process(again.value)
            await new.append(_message("theirs"))


async def _kafka_barrier(url: str, pch: str, headers: list[tuple[str, bytes]]) -> None:
    """Append a barrier as another writer would, with these headers."""
    producer = AIOKafkaProducer(bootstrap_servers=servers(url), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(f"walsvc.{pch}", b"", partition=0, headers=headers)
    finally:
        await producer.stop()


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([("walsvc.barrier", b"")], id="an-older-writers-barrier"),
        pytest.param(
            [("walsvc.barrier", b""), ("walsvc.writer", b"\xff\xfe")], id="an-unreadable-name"
        ),
    ],
)
async def test_a_kafka_barrier_without_a_name_fences_as_before(
    tansu_url: str, headers: list[tuple[str, bytes]]
) -> None:
    pch = fresh()
    async with asyncio.timeout(KAFKA_HANG), await walsvc.open_wal(tansu_url, pch) as old:
        await old.append(_message("mine"))
        await _kafka_barrier(tansu_url, pch, headers)
        with pytest.raises(WALFenced) as raised:
            await old.append(_message("late"))
        _assert_names_nobody(raised.value)


# -- pulsar:// ----------------------------------------------------------------------------


async def test_a_pulsar_writer_fenced_by_another_open_is_told_its_pid_and_host(
    broker: PulsarLite,
) -> None:
    pch = pchannel()
    async with asyncio.timeout(PULSAR_HANG), await walsvc.open_wal(broker.url, pch) as old:
        await old.append(data("mine", 0))
        async with await walsvc.open_wal(broker.url, pch) as new:
            with pytest.raises(WALFenced) as raised:
                await old.append(data("late", 0))
            _assert_names_this_process(raised.value)
            assert f"term {old.term} was fenced by a writer with term {new.term}" in str(
                raised.value
            )
            with pytest.raises(WALFenced) as again:  # fenced for good, and still named
                await old.append(data("later", 0))
            _assert_names_this_process(again.value)
            await new.append(data("theirs", 0))


async def test_a_pulsar_writer_fenced_by_the_broker_is_told_who_from_the_log(
    broker: PulsarLite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apache Pulsar fences the older ``ExclusiveWithFencing`` producer itself, so its
    sends fail (``ProducerFenced``) before it reads any barrier; the writer then looks the
    barrier up. Pulsar Lite does not enforce exclusive producers (see
    ``test_pulsar_writer.test_broker_fences_an_exclusive_producer``), so the broker's
    refusal is stood in for here."""
    pch = pchannel()
    async with asyncio.timeout(PULSAR_HANG), await walsvc.open_wal(broker.url, pch) as old:
        await old.append(data("mine", 0))
        async with await walsvc.open_wal(broker.url, pch) as new:

            async def fenced_by_the_broker(*args: Any, **kwargs: Any) -> None:
                raise Fenced

            monkeypatch.setattr(walsvc.backends._pulsar._writer, "send_group", fenced_by_the_broker)
            with pytest.raises(WALFenced) as raised:
                await old.append(data("late", 0))
            monkeypatch.undo()
            _assert_names_this_process(raised.value)
            assert f"fenced by a writer with term {new.term}" in str(raised.value)


async def test_a_pulsar_truncate_after_a_takeover_names_the_new_writer(broker: PulsarLite) -> None:
    pch = pchannel()
    async with asyncio.timeout(PULSAR_HANG), await walsvc.open_wal(broker.url, pch) as old:
        sent = await old.append(data("mine", 0))
        async with await walsvc.open_wal(broker.url, pch):
            with pytest.raises(WALFenced) as raised:
                await old.truncate(sent.message_id)
            _assert_names_this_process(raised.value)


async def test_a_pulsar_barrier_without_a_name_fences_as_before(broker: PulsarLite) -> None:
    pch = pchannel()
    async with asyncio.timeout(PULSAR_HANG), await walsvc.open_wal(broker.url, pch) as old:
        await old.append(data("mine", 0))
        client = pulsar_asyncio.Client(broker.url, logger=client_logger())
        try:  # an older writer's barrier: no walsvc.writer property
            producer = await client.create_producer(backend_of(old).topic, batching_enabled=False)
            await producer.send(b"", properties={"walsvc.barrier": "1"})
        finally:
            await client.close()
        with pytest.raises(WALFenced) as raised:
            await old.append(data("late", 0))
        _assert_names_nobody(raised.value)
