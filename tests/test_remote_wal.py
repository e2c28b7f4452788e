"""The WAL over walsvc://: a node in a subprocess (``walsvc serve``), clients over real
sockets. Round trips of every method of the slice, errors as the same types, concurrent
producer processes, node-side filtering, credit, version negotiation and hostile peers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _chain_support import take
from _node_process import ROOT, node_process

import walsvc
from walsvc import DeliverPolicy, Filter, Message, MessageType
from walsvc.remote._client import RemoteWAL


def _pchannel() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


async def test_appends_and_reads_round_trip(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        assert isinstance(wal, walsvc.WAL)
        assert isinstance(wal, RemoteWAL)
        assert not wal.read_only
        assert wal.term >= 1
        assert not wal.closed
        one = await wal.append(Message(payload=b"a", vchannel="v1", properties={"k": "v"}))
        many = await wal.append_many(
            [Message(payload=b"b%d" % i, vchannel=f"v{i % 2}") for i in range(10)]
        )
        assert [r.timetick for r in [one, *many]] == sorted({r.timetick for r in [one, *many]})
        assert await wal.latest_message_id() == many[-1].message_id
        keyed = Message(payload=b"k", vchannel="v1", idempotency_key="key-1")
        first, again = await wal.append(keyed), await wal.append(keyed)
        assert first == again
        everything = await take(wal.read(), 12)
        assert [m.message_id for m in everything] == [r.message_id for r in [one, *many, first]]
        assert everything[0].properties == {"k": "v"}
        assert everything[0].payload == b"a"
        v1 = await take(wal.read(DeliverPolicy.all(), [Filter(vchannels=["v1"])]), 7)
        assert {m.vchannel for m in v1} == {"v1"}
        start = many[4].message_id
        assert (await take(wal.read(DeliverPolicy.start_from(start)), 1))[0].message_id == start
        after = await take(wal.read(DeliverPolicy.start_after(start)), 1)
        assert after[0].message_id == many[5].message_id
        checkpoint = everything[5].checkpoint
        resumed = await take(wal.read(DeliverPolicy.from_checkpoint(checkpoint)), 1)
        assert resumed[0].message_id == everything[6].message_id
        floor = await take(
            wal.read(DeliverPolicy.all(), [Filter(min_timetick=many[8].timetick)]), 1
        )
        assert floor[0].message_id == many[8].message_id
        latest = wal.read(DeliverPolicy.latest())
        ticks = wal.read(DeliverPolicy.all(), [Filter(types=[MessageType.DELETE])], timeticks=True)
        assert (await take(ticks, 1))[0].type is MessageType.TIME_TICK
        await ticks.aclose()
        newest = await wal.append(Message(payload=b"new", vchannel="v9"))
        assert (await take(latest, 1))[0].message_id == newest.message_id
        assert latest.stats().delivered == 1


async def test_the_node_owns_the_writer_options(node: str) -> None:
    with pytest.raises(walsvc.InvalidArgument, match="node's writer owns"):
        await walsvc.open_wal(node, "p", interceptors=[])


async def test_errors_arrive_as_the_same_types(node: str) -> None:
    pchannel = _pchannel()
    wal = await walsvc.open_wal(node, pchannel)
    with pytest.raises(walsvc.MessageTooLarge, match="max_message_size"):
        await wal.append(Message(payload=b"x" * (6 << 20), vchannel="v"))
    with pytest.raises(walsvc.MessageTooLarge, match="frame"):
        await wal.append_many([Message(payload=b"x" * (4 << 20), vchannel="v")] * 5)
    with pytest.raises(walsvc.InvalidArgument, match="pchannel"):
        await walsvc.open_wal(node, "bad/name")
    with pytest.raises(walsvc.InvalidMessage):
        await wal.append(Message(payload=b"", vchannel="v", type=MessageType.TIME_TICK))
    reader = await walsvc.open_wal(node, pchannel, read_only=True)
    with pytest.raises(walsvc.WALReadOnly):
        await reader.append(Message(payload=b"x", vchannel="v"))
    await reader.aclose()
    assert (await wal.append(Message(payload=b"ok", vchannel="v"))).timetick > 0
    scanner = wal.read()
    await wal.aclose()
    assert wal.closed
    with pytest.raises(walsvc.WALClosed):
        await wal.append(Message(payload=b"x", vchannel="v"))
    with pytest.raises(walsvc.WALClosed):
        await scanner.__anext__()
    with pytest.raises(walsvc.WALClosed):
        wal.read()


async def test_a_version_the_node_does_not_speak_is_refused_naming_its_range(node: str) -> None:
    with pytest.raises(walsvc.WALError, match=r"speaks protocol versions 1\.\.3.*speaks 7\.\.9"):
        await walsvc.open_wal(node, "p", versions=(7, 9))


async def test_one_of_sixteen_vchannels_receives_only_its_share(node: str) -> None:
    async with await walsvc.open_wal(node, _pchannel()) as wal:
        payload = b"p" * 1000
        for _ in range(5):
            await wal.append_many(
                [Message(payload=payload, vchannel=f"v{i % 16}") for i in range(160)]
            )
        reader = await walsvc.open_wal(node, wal.pchannel, read_only=True)
        assert isinstance(reader, RemoteWAL)
        got = await take(reader.read(DeliverPolicy.all(), [Filter(vchannels=["v3"])]), 50)
        assert {m.vchannel for m in got} == {"v3"}
        total = 800 * len(payload)
        received = reader.connection.received_bytes
        # Its share is 1/16 of the payload bytes; the envelope adds little.
        assert len(got) * len(payload) <= received < total / 10
        await reader.aclose()


async def test_a_stalled_reader_holds_only_its_credit(node: str) -> None:
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as wal:
        stalled_wal = await walsvc.open_wal(node, pchannel, read_only=True, window_messages=20)
        stalled = stalled_wal.read()
        for _ in range(10):
            await wal.append_many([Message(payload=b"m", vchannel="v") for _ in range(100)])
        other = await take(wal.read(), 1000)  # another reader is not slowed by it
        assert len(other) == 1000
        await asyncio.sleep(0.2)
        held = sum(len(b) for b in stalled._buffer)  # type: ignore[attr-defined]
        assert held <= 20
        rest = await take(stalled, 1000)  # and it resumes, missing nothing
        assert [m.message_id for m in rest] == [m.message_id for m in other]
        await stalled_wal.aclose()


_PRODUCER = """
import asyncio, json, sys
import walsvc
async def main(url, pchannel, name, count):
    async with await walsvc.open_wal(url, pchannel) as wal:
        async def one(i):
            r = await wal.append(walsvc.Message(payload=f"{name}-{i}".encode(), vchannel=name))
            return [r.message_id.marshal(), r.timetick]
        results = await asyncio.gather(*(one(i) for i in range(count)))
    print(json.dumps(results))
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


async def test_two_producer_processes_append_to_one_pchannel(node: str) -> None:
    pchannel, count = _pchannel(), 500
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _PRODUCER,
            node,
            pchannel,
            f"w{n}",
            str(count),
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        for n in range(2)
    ]
    outputs = [await p.communicate() for p in processes]
    assert all(p.returncode == 0 for p in processes)
    acked = {tuple(r) for out, _ in outputs for r in json.loads(out)}
    assert len(acked) == 2 * count
    async with await walsvc.open_wal(node, pchannel, read_only=True) as reader:
        log = await take(reader.read(), 2 * count)
    ticks = [m.timetick for m in log]
    assert ticks == sorted(ticks)
    assert len(set(ticks)) == len(ticks)
    assert {(m.message_id.marshal(), m.timetick) for m in log} == acked
    for name in ("w0", "w1"):
        mine = [m.payload for m in log if m.vchannel == name]
        assert sorted(mine) == sorted(f"{name}-{i}".encode() for i in range(count))


def _raw_client(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "attack",
    ["garbage", "absurd_length", "oversized_frame", "garbage_after_handshake"],
)
async def test_a_hostile_peer_is_disconnected_alone(attack: str, tmp_path: Path) -> None:
    log: list[str] = []
    with node_process(f"memory://hostile-{uuid.uuid4().hex[:6]}", log=log) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        async with await walsvc.open_wal(url, "p0") as wal:
            await wal.append(Message(payload=b"before", vchannel="v"))

            def attack_node() -> bool:
                sock = _raw_client(port)
                try:
                    if attack == "garbage":
                        sock.sendall(struct.pack(">I", 9) + b"\xc1garbage!")
                    elif attack == "absurd_length":
                        sock.sendall(b"\xff\xff\xff\xf0" + b"x" * 100)
                    elif attack == "oversized_frame":
                        sock.sendall(struct.pack(">I", 17 << 20) + b"\x91" + b"\0" * (1 << 20))
                    else:
                        hello = b"\x91\x95\x01\x01\x01\xc0\xa1x"
                        sock.sendall(struct.pack(">I", len(hello)) + hello)
                        sock.recv(4096)
                        sock.sendall(struct.pack(">I", 3) + b"\x91\x92\x63")
                except (ConnectionResetError, BrokenPipeError):
                    return True
                try:
                    return _closed_by_peer(sock)
                finally:
                    sock.close()

            appends = [wal.append(Message(payload=b"during", vchannel="v")) for _ in range(50)]
            closed, *results = await asyncio.gather(asyncio.to_thread(attack_node), *appends)
            assert closed
            assert len(results) == 50
            assert (await wal.append(Message(payload=b"after", vchannel="v"))).timetick > 0
    assert "".join(log).count("disconnected") == 1, log  # the node's whole log
