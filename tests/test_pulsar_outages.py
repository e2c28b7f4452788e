"""The ``pulsar://`` backend when the broker refuses a message or stops answering (Pulsar
Lite paused with SIGSTOP; see _pulsar_lite.py), and the translation of every result code
of pulsar-client, and a creation of pulsar-client that never returns. Timeouts here
only guard against hangs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_asyncio
import pytest
from _pulsar_lite import HANG, PulsarLite, backend_of, broker, data, own_broker, pchannel
from pulsar import _pulsar

import walsvc
import walsvc.backends._pulsar._log
from walsvc import DeliverPolicy, Message, MessageType
from walsvc.backends._pulsar._client import translate
from walsvc.core._encode import encode

__all__ = ("broker", "own_broker")


def translate_result(code: int, what: str) -> walsvc.WALError:
    """What the backend raises for a failed call that reported result ``code``."""
    return translate(pulsar_asyncio.PulsarException(_pulsar.Result(code)), what)


async def settle(calls: list[asyncio.Future[walsvc.AppendResult]]) -> list[object]:
    return await asyncio.gather(*calls, return_exceptions=True)


async def test_a_message_over_the_brokers_limit_is_refused_at_once(broker: PulsarLite) -> None:
    """A message within the WAL's max_message_size but over the broker's own limit (Pulsar
    Lite: 5 MiB) raises MessageTooLarge, not a retriable BackendUnavailable after 30 s of
    retries (Result.MessageTooBig was translated as an unknown result); the appends sent
    in the same group are acknowledged, and a reader sees exactly those."""
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, max_message_size=64 << 20) as wal:
        calls = [asyncio.ensure_future(wal.append(data("small", i))) for i in range(5)]
        calls.append(
            asyncio.ensure_future(wal.append(Message(payload=bytes(6 << 20), vchannel="v")))
        )
        calls += [asyncio.ensure_future(wal.append(data("small", i))) for i in range(5, 10)]
        async with asyncio.timeout(HANG):
            results = await settle(calls)
        big = results.pop(5)
        assert isinstance(big, walsvc.MessageTooLarge), big
        assert "MessageTooBig" in str(big)
        assert all(isinstance(r, walsvc.AppendResult) for r in results), results
        acked = {f"small:{i}": r.message_id for i, r in enumerate(results)}  # type: ignore[union-attr]
        after = await wal.append(data("after", 0))
    got: dict[str, list[walsvc.MessageId]] = {}
    async with await walsvc.open_wal(broker.url, pch, read_only=True) as reader:
        async with (
            asyncio.timeout(HANG),
            reader.read(DeliverPolicy.all(), raw=True, use_cache=False) as scanner,
        ):
            async for message in scanner:
                if message.type is MessageType.INSERT:
                    assert len(message.payload) < 1 << 20
                    got.setdefault(message.properties["n"], []).append(message.message_id)
                if message.message_id >= after.message_id:
                    break
    assert got.pop("after:0") == [after.message_id]
    assert got == {label: [at] for label, at in acked.items()}


@pytest.mark.parametrize("code", [*(int(r) for r in pulsar.Result.__members__.values()), -1, 46])
def test_every_result_code_is_a_named_walsvc_error(code: int) -> None:
    """Each result pulsar-client can give (its enum, and the codes of the bundled C++
    client it does not name: 46 showed as ``46 ???``) becomes a WALError naming it."""
    if code == 0:
        return  # Ok is not an error
    error = translate_result(code, "doing x")
    assert isinstance(error, walsvc.WALError)
    assert "???" not in str(error)
    assert "which this walsvc does not know" not in str(error)
    name = {-1: "Retryable", 46: "Disconnected"}.get(code) or pulsar.Result(code).name
    assert f"Pulsar result {name} ({code})" in str(error)


def test_result_codes_translate_to_what_they_mean() -> None:
    result = {name: int(value) for name, value in pulsar.Result.__members__.items()}
    assert isinstance(translate_result(result["MessageTooBig"], "x"), walsvc.MessageTooLarge)
    assert isinstance(translate_result(result["ProducerFenced"], "x"), walsvc.WALFenced)
    assert isinstance(translate_result(result["AlreadyClosed"], "x"), walsvc.WALClosed)
    assert isinstance(translate_result(result["ChecksumError"], "x"), walsvc.CorruptRecord)
    assert isinstance(translate_result(result["InvalidTopicName"], "x"), walsvc.InvalidArgument)
    for retriable in (result["Timeout"], result["ConnectError"], 46):
        assert translate_result(retriable, "x").retriable
    for refused in (result["AuthorizationError"], result["TopicTerminated"]):
        assert not translate_result(refused, "x").retriable
    unknown = translate_result(99, "x")
    assert isinstance(unknown, walsvc.BackendUnavailable)
    assert "Result<99> (99)" in str(unknown)
    assert "Pulsar result Timeout" in str(translate(pulsar.Timeout("late"), "x"))


async def test_an_append_is_acknowledged_only_with_its_own_messages(
    own_broker: PulsarLite,
) -> None:
    """The Kafka writer's bug of issue 20 (point 1), tried on the Pulsar writer: group A
    times out while the broker is paused and its outcome cannot be read (A raises
    AppendOutcomeUnknown, and may land when the broker resumes); group B, appended
    meanwhile, resumes with the broker. Every acknowledged append is delivered at the id
    it was acknowledged with: a group is recognised by its name, never by position."""
    pch = pchannel()
    wal = await walsvc.open_wal(own_broker.url, pch, operation_timeout=1.0, interceptors=[])
    acked: dict[str, walsvc.MessageId] = {}
    try:
        for i in range(3):
            acked[f"pre:{i}"] = (await wal.append(data("pre", i))).message_id
        own_broker.pause()
        async with asyncio.timeout(HANG):
            first = await settle(
                [asyncio.ensure_future(wal.append(data("a", k))) for k in range(8)]
            )
        assert all(isinstance(r, walsvc.WALError) for r in first), first
        second = [asyncio.ensure_future(wal.append(data("b", k))) for k in range(8)]
        # B's reading of the log (the writer lost its end with A) has timed out, 1 s ago
        await asyncio.sleep(2.0)
        own_broker.resume()
        async with asyncio.timeout(HANG):
            for k, result in enumerate(await settle(second)):
                assert isinstance(result, walsvc.AppendResult | walsvc.WALError), result
                if isinstance(result, walsvc.AppendResult):
                    acked[f"b:{k}"] = result.message_id
            for k in range(8):
                acked[f"c:{k}"] = (await wal.append(data("c", k))).message_id
    finally:
        own_broker.resume()
        await wal.aclose()
    assert len(set(acked.values())) == len(acked), "an id was acknowledged twice"
    got: dict[str, list[walsvc.MessageId]] = {}
    async with await walsvc.open_wal(own_broker.url, pch, read_only=True) as reader:
        async with (
            asyncio.timeout(HANG),
            reader.read(DeliverPolicy.all(), raw=True, use_cache=False) as scanner,
        ):
            async for message in scanner:
                if message.type is MessageType.INSERT:
                    got.setdefault(message.properties["n"], []).append(message.message_id)
                if message.message_id >= max(acked.values()):
                    break
    wrong = {label: (at, got.get(label)) for label, at in acked.items() if got.get(label) != [at]}
    assert not wrong, f"acknowledged but not delivered (once) at that id: {wrong}"


async def test_closing_while_the_broker_does_not_answer(own_broker: PulsarLite) -> None:
    """The broker stops answering with appends in flight and queued and a scanner open:
    the WAL's close returns (within the hang guard), raises nothing, and every append
    gets a WALError. The close lets appends go on for ``close_timeout`` (1 s): it gives up
    on the group in flight while the writer reads the log after its failed send (sends
    time out after ``operation_timeout``, 1 s after the pause; the read would give up 1 s
    later)."""
    wal = await walsvc.open_wal(
        own_broker.url, pchannel(), operation_timeout=1.0, close_timeout=1.0
    )
    try:
        for i in range(10):
            await wal.append(data("a", i))
        scanner = wal.read(DeliverPolicy.all())
        async with asyncio.timeout(HANG):
            await anext(scanner)
        own_broker.pause()
        pending = [asyncio.ensure_future(wal.append(data("q", i))) for i in range(20)]
        await asyncio.sleep(0.5)
        async with asyncio.timeout(HANG):
            await wal.aclose()
            results = await settle(pending)
        assert all(isinstance(r, walsvc.WALError) for r in results), results
    finally:
        own_broker.resume()
        await wal.aclose()


async def test_a_close_is_bounded_by_close_timeout(own_broker: PulsarLite) -> None:
    """With operations allowed 60 s, ``WAL.aclose`` ends after ``close_timeout``, inside
    the 30 s hang guard (the WAL starts the backend's close before it drains its queued
    appends): the append in flight fails with AppendOutcomeUnknown, the queued ones with
    WALClosed, and nothing raises."""
    wal = await walsvc.open_wal(
        own_broker.url, pchannel(), operation_timeout=60.0, close_timeout=1.0, interceptors=[]
    )
    try:
        await wal.append(data("first", 0))
        own_broker.pause()
        in_flight = asyncio.ensure_future(wal.append(data("sent", 1)))
        await asyncio.sleep(0.2)  # that group is sent; these wait behind it
        queued = [asyncio.ensure_future(wal.append(data("q", i))) for i in range(2, 5)]
        await asyncio.sleep(0)
        async with asyncio.timeout(30.0):
            await wal.aclose()
            outcomes = await settle([in_flight, *queued])
        assert isinstance(outcomes[0], walsvc.AppendOutcomeUnknown), outcomes
        assert all(isinstance(r, walsvc.WALClosed) for r in outcomes[1:]), outcomes
    finally:
        own_broker.resume()
        await wal.aclose()


async def test_a_reader_creation_that_never_returns_fails_the_read(
    broker: PulsarLite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pulsar-client's synchronous ``create_reader`` was seen never to return (its client
    closed right after a broker restart). Injected here: the creation of a scanner's
    reader is held in its thread until the test lets it go. The read fails with
    ``BackendUnavailable`` within the creation bound (connect + 2 x operation timeout:
    3 s), not never; the WAL goes on appending; the reader made after the read gave up
    is closed while the WAL is still open."""
    wal = await walsvc.open_wal(broker.url, pchannel(), operation_timeout=1.0, connect_timeout=1.0)
    let_go = threading.Event()
    held: list[Any] = []
    real_reader = walsvc.backends._pulsar._log.Reader

    def first_held(reader: Any, schema: Any) -> Any:
        made = real_reader(reader, schema)
        if not held:
            held.append(made)
            let_go.wait(HANG)
        return made

    try:
        await wal.append(data("before", 0))
        monkeypatch.setattr(walsvc.backends._pulsar._log, "Reader", first_held)
        scanner = wal.read(DeliverPolicy.all())
        with pytest.raises(walsvc.BackendUnavailable, match="did not finish creating a reader"):
            async with asyncio.timeout(HANG):
                await anext(scanner)
        assert len(held) == 1
        assert held[0]._reader.is_connected()
        in_flight = set(backend_of(wal).client.creations._in_flight)  # with its disposal
        await wal.append(data("meanwhile", 1))
        let_go.set()
        await asyncio.wait(in_flight, timeout=HANG)
        assert not held[0]._reader.is_connected()
        await wal.append(data("after", 2))
    finally:
        let_go.set()
        await wal.aclose()


def envelope(i: int) -> bytes:
    """A stored envelope of a small data message (the backend's own input)."""
    return encode(data("raw", i), timetick=1 + i, term=1)


@pytest.mark.parametrize(
    ("result", "empty"),
    [
        pytest.param(_pulsar.Result.Timeout, False, id="a-timeout-is-an-error"),
        pytest.param(_pulsar.Result.UnknownError, True, id="unknown-error-reads-as-empty"),
    ],
)
async def test_a_failed_tail_lookup_is_an_error_not_an_empty_log(
    broker: PulsarLite, monkeypatch: pytest.MonkeyPatch, result: Any, empty: bool
) -> None:
    """The lookup of the topic's last entry fails (replayed: the broker cannot be made to
    fail it on demand). Only UnknownError, Pulsar Lite's answer for a topic without
    entries, reads as an empty log; any other failure is a typed error, never a
    latest_message_id of None for a log that holds messages."""
    pch = pchannel()
    async with await walsvc.open_wal(broker.url, pch, interceptors=[]) as wal:
        await wal.append(data("m", 0))
    async with await walsvc.open_wal(broker.url, pch, read_only=True) as reader:

        async def fails(consumer: Any) -> Any:
            raise pulsar_asyncio.PulsarException(result)

        monkeypatch.setattr(walsvc.backends._pulsar._log, "last_message_id", fails)
        async with asyncio.timeout(HANG):
            if empty:
                assert await reader.latest_message_id() is None
            else:
                with pytest.raises(walsvc.WALError, match="cannot look up the tail"):
                    await reader.latest_message_id()
