"""A real Pulsar-protocol broker for tests: Pulsar Lite (the ``pulsar-lite`` wheel).

``PulsarLite`` runs ``pulsar-lite --config FILE --addr 127.0.0.1:PORT --db-path DIR`` as a
subprocess on a free loopback port with its own data directory and metrics turned off
(so brokers of parallel tests never clash), waits until the port accepts connections, and
stops it by its own pid. ``restart()`` stops it and starts it again on the same port and
data directory: what was stored survives, which the fault tests rely on.

A broker that does not come up FAILS the test with its stderr (never a skip).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, final

import pulsar_lite
import pytest

__all__ = ("PulsarLite", "pulsar_lite_broker")

_BINARY: Final = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
_READY_WITHIN: Final = 20.0
_STOP_WITHIN: Final = 5.0
_CONFIG: Final = "[metrics]\nenabled = false\n"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@final
class PulsarLite:
    """One Pulsar Lite broker process with a fixed port and data directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.db_path = workdir / "db"
        self.config = workdir / "pulsar-lite.toml"
        self.config.write_text(_CONFIG)
        self.port = _free_port()
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr_path = workdir / "stderr.log"

    def start(self) -> None:
        """Start the broker and wait (bounded) until its port accepts connections; fail
        the test with the broker's stderr if it does not."""
        assert self._process is None, "broker already running"
        stderr = self._stderr_path.open("ab")
        try:
            self._process = subprocess.Popen(
                [
                    str(_BINARY),
                    "--config",
                    str(self.config),
                    "--addr",
                    f"127.0.0.1:{self.port}",
                    "--db-path",
                    str(self.db_path),
                    "--log-level",
                    "warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=self.workdir,
            )
        finally:
            stderr.close()
        deadline = time.monotonic() + _READY_WITHIN
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if _accepts(self.port):
                return
            time.sleep(0.02)
        code = self._process.poll()
        self.stop()
        pytest.fail(
            f"Pulsar Lite did not accept connections on port {self.port} within"
            f" {_READY_WITHIN} s (exit code {code}); stderr:\n{self.stderr()}",
            pytrace=False,
        )

    def stop(self) -> None:
        """Stop the broker by its pid: SIGTERM, then SIGKILL if it lingers."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(_STOP_WITHIN)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait(_STOP_WITHIN)

    def restart(self) -> None:
        """Stop and start again on the same port and data directory (data survives)."""
        self.stop()
        self.start()

    def stderr(self) -> str:
        """What the broker wrote to stderr so far (all of its runs)."""
        try:
            return self._stderr_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""


@contextlib.contextmanager
def pulsar_lite_broker(workdir: Path) -> Iterator[PulsarLite]:
    """A started broker in ``workdir``, stopped on exit."""
    broker = PulsarLite(workdir)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
