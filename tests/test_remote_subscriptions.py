"""Durable subscriptions, ``truncate`` and ``delete_subscription`` over walsvc://: a node
in a subprocess (memory:// and file://), clients over real sockets and in other
processes. A subscription resumes after its last acknowledged message when its client
comes back (after a clean close, and after the client process was killed); one reader
per name across processes; ``flush`` makes the checkpoint durable before the node dies;
every error arrives as the type a local WAL raises (the same script runs on both).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _chain_support import take
from _node_process import ROOT, node_process

import walsvc
from walsvc import DeliverPolicy, Filter, Message


def _pchannel() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


async def _append(wal: walsvc.WAL, count: int, vchannel: str = "v") -> list[walsvc.AppendResult]:
    return await wal.append_many(
        [Message(payload=b"%d" % i, vchannel=vchannel) for i in range(count)]
    )


#: A client process: reads subscription "s" of argv[2] on the node argv[1], acks the
#: first argv[3] messages, says so, and waits to be killed (its connection then drops).
_HOLDER = """
import asyncio, sys, walsvc
async def main():
    wal = await walsvc.open_wal(sys.argv[1], sys.argv[2])
    scanner = wal.read(subscription="s", checkpoint_interval=3600)
    for _ in range(int(sys.argv[3])):
        await scanner.ack(await anext(scanner))
    # Acks have no answer: a request behind them on the same connection is answered
    # once the node read them (killed before, the holder's acks would never leave).
    await wal.latest_message_id()
    print("acked", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_a_subscription_resumes_after_its_acks_when_its_client_comes_back(
    node: str,
) -> None:
    pchannel = _pchannel()
    async with await walsvc.open_wal(node, pchannel) as wal:
        sent = await _append(wal, 10)
        async with wal.read(subscription="s") as scanner:
            first = await take(scanner, 4)
            for message in first[:3]:
                await scanner.ack(message)
        # A clean close wrote the checkpoint: the next reader starts at the 4th message.
    async with await walsvc.open_wal(node, pchannel) as wal:
        async with wal.read(subscription="s") as scanner:
            assert [m.message_id for m in await take(scanner, 2)] == [
                r.message_id for r in sent[3:5]
            ]
            # Not acknowledged: the checkpoint stays where it was.

    # A client process that acks 6 and is killed: its connection drops, and while it
    # held the name another process's reader was refused.
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, node, pchannel, "6", cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        async with asyncio.timeout(30):
            assert await holder.stdout.readline() == b"acked\n"
        async with await walsvc.open_wal(node, pchannel) as wal:
            busy = wal.read(subscription="s")
            with pytest.raises(walsvc.SubscriptionBusy):
                await anext(busy)
            await busy.aclose()
            with pytest.raises(walsvc.SubscriptionBusy):
                await wal.delete_subscription("s")
    finally:
        holder.kill()
        await holder.wait()
    async with await walsvc.open_wal(node, pchannel) as wal:
        async with asyncio.timeout(30):
            while True:  # the node notices the drop and releases the name
                scanner = wal.read(subscription="s")
                try:
                    resumed = await anext(scanner)
                    break
                except walsvc.SubscriptionBusy:
                    await scanner.aclose()
                    await asyncio.sleep(0.05)
        assert resumed.message_id == sent[3 + 6].message_id
        await scanner.aclose()
        await wal.delete_subscription("s")
        async with wal.read(subscription="s") as scanner:  # deleted: from ``deliver`` again
            assert (await anext(scanner)).message_id == sent[0].message_id


async def test_flush_makes_the_checkpoint_durable_before_the_node_dies(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    pchannel = _pchannel()
    with node_process(url) as (node, process):
        wal = await walsvc.open_wal(node, pchannel)
        try:
            sent = await _append(wal, 6)
            flushed = wal.read(subscription="flushed", checkpoint_interval=3600)
            unflushed = wal.read(subscription="unflushed", checkpoint_interval=3600)
            for scanner in (flushed, unflushed):
                got = await take(scanner, 3)
                for message in got:  # the first is written at once, the next two wait 3600 s
                    await scanner.ack(message)
            await flushed.flush()
            process.kill()  # no clean close: only what was written survives
            process.wait()
        finally:
            await wal.aclose()
    with node_process(url) as (node, _):
        async with await walsvc.open_wal(node, pchannel) as wal:
            async with wal.read(subscription="flushed") as scanner:
                assert (await anext(scanner)).message_id == sent[3].message_id
            async with wal.read(subscription="unflushed") as scanner:
                resumed = (await anext(scanner)).message_id
                # Its first ack (written at once, if that write finished) at most.
                assert resumed in (sent[0].message_id, sent[1].message_id)


async def _error_script(wal: walsvc.WAL, reader: walsvc.WAL) -> list[str]:
    """Provoke the subscription, truncate and delete_subscription errors on ``wal``
    (``reader``: a read-only handle of the same pchannel); return the types met."""
    met: list[str] = []

    async def expect(call: object) -> None:
        try:
            result = call() if callable(call) else await call  # type: ignore[misc]
            if isinstance(result, walsvc.Scanner):
                try:
                    await asyncio.wait_for(anext(result), 0.5)
                finally:
                    await result.aclose()
        except TimeoutError:
            met.append("no error")
        except Exception as exc:
            met.append(type(exc).__name__)
        else:
            met.append("no error")

    sent = await _append(wal, 5)
    plain = wal.read()
    first = (await take(plain, 1))[0]
    await expect(plain.ack(first))  # InvalidArgument: no subscription
    await plain.aclose()
    scanner = wal.read(DeliverPolicy.all(), [Filter(vchannels=["v"])], subscription="a")
    await expect(scanner.ack(first))  # InvalidArgument: nothing delivered yet
    await expect(scanner.ack("not a message"))  # type: ignore[arg-type]  # TypeError
    mine = (await take(scanner, 1))[0]
    await expect(scanner.ack(mine))  # no error
    await expect(lambda: wal.read(subscription="a"))  # SubscriptionBusy, at once here
    await expect(wal.delete_subscription("a"))  # SubscriptionBusy
    await expect(scanner.flush())  # no error
    await scanner.aclose()
    await expect(scanner.ack(mine))  # WALClosed
    other = [Filter(vchannels=["other"])]
    await expect(lambda: wal.read(DeliverPolicy.all(), other, subscription="a"))  # mismatch
    await expect(lambda: wal.read(subscription="bad name"))  # InvalidArgument
    await expect(lambda: wal.read(subscription="b", checkpoint_interval=-1))
    await expect(wal.delete_subscription("bad name"))  # InvalidArgument
    await expect(wal.delete_subscription("never-read"))  # no error
    await expect(reader.delete_subscription("a"))  # no error: read-only handles may
    await expect(lambda: reader.read(subscription="c"))  # no error: and may read one
    await expect(reader.truncate(sent[0].message_id))  # WALReadOnly
    await expect(wal.truncate(sent[1].message_id))  # no error
    await expect(lambda: wal.read(DeliverPolicy.start_from(sent[0].message_id), raw=True))
    await expect(wal.truncate("memory:1"))  # type: ignore[arg-type]  # InvalidArgument
    await reader.aclose()
    await expect(reader.delete_subscription("a"))  # WALClosed
    await wal.aclose()
    await expect(wal.truncate(sent[2].message_id))  # WALClosed
    await expect(wal.delete_subscription("a"))  # WALClosed
    await expect(lambda: wal.read(subscription="a"))  # WALClosed
    return met


async def test_errors_are_the_types_a_local_wal_raises(node: str) -> None:
    pchannel = _pchannel()
    local = await walsvc.open_wal(f"memory://local-{pchannel}", pchannel)
    local_ro = await walsvc.open_wal(f"memory://local-{pchannel}", pchannel, read_only=True)
    remote = await walsvc.open_wal(node, pchannel)
    remote_ro = await walsvc.open_wal(node, pchannel, read_only=True)
    try:
        expected = await _error_script(local, local_ro)
        assert await _error_script(remote, remote_ro) == expected
    finally:  # (the scripts close them; a failing one may not have)
        for wal in (local, local_ro, remote, remote_ro):
            await wal.aclose()
    assert expected == [
        "InvalidArgument",
        "InvalidArgument",
        "TypeError",
        "no error",
        "SubscriptionBusy",
        "SubscriptionBusy",
        "no error",
        "WALClosed",
        "SubscriptionMismatch",
        "InvalidArgument",
        "InvalidArgument",
        "InvalidArgument",
        "no error",
        "no error",
        "no error",
        "WALReadOnly",
        "no error",
        "WALTruncated",
        "InvalidArgument",
        "WALClosed",
        "WALClosed",
        "WALClosed",
        "WALClosed",
    ]
