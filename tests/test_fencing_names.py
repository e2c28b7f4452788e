"""A fenced writer learns who fenced it: the error names the process (pid and host) of
the read-write open that took the pchannel over, and says that readers open read-only."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import walsvc
from walsvc import Message

_OTHER_PROCESS = """
import asyncio, os, sys
import walsvc

async def main(url):
    async with await walsvc.open_wal(url, "p") as wal:
        await wal.wait_ready()
        print(os.getpid(), flush=True)

asyncio.run(main(sys.argv[1]))
"""


async def test_a_file_writer_fenced_by_another_process_is_told_its_pid_and_host(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p") as wal:
        await wal.append(Message(payload=b"mine", vchannel="v"))
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _OTHER_PROCESS, url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        pid = int(done.stdout.split()[0])
        with pytest.raises(walsvc.WALFenced) as raised:
            await wal.append(Message(payload=b"late", vchannel="v"))
    text = str(raised.value)
    assert f"pid {pid} on {socket.gethostname()}" in text, text
    assert "read_only=True" in text


async def test_a_read_only_open_fences_nobody(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    async with await walsvc.open_wal(url, "p") as wal:
        async with await walsvc.open_wal(url, "p", read_only=True) as reader:
            async with reader.read() as scanner:
                sent = await wal.append(Message(payload=b"x", vchannel="v"))
                async with asyncio.timeout(30):
                    assert (await anext(scanner)).message_id == sent.message_id
        await wal.append(Message(payload=b"still the writer", vchannel="v"))
