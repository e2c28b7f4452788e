"""Starting a Pulsar Lite broker (Pulsar protocol) for tests, benchmarks and local
experiments.

``start_pulsar_lite()`` runs the ``pulsar-lite`` binary of the ``pulsar-lite`` wheel as
``pulsar-lite --config FILE --addr 127.0.0.1:PORT --db-path DIR`` on a free loopback port,
with its own data directory and metrics turned off (so brokers started side by side never
clash), and returns once the port accepts connections. ``PulsarLite.stop()`` stops it by
its pid; ``restart()`` stops it and starts it again on the same port and data directory,
so what was stored survives; ``pause()``/``resume()`` freeze and thaw it (SIGSTOP and
SIGCONT: connections stay open, nothing is answered). ``close()`` stops it and removes
a data directory that ``start_pulsar_lite`` created itself. Open a WAL on it with
``walsvc.open_wal(broker.url, pchannel)``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final, final

from ._tansu import wait_stopped
from ._tether import tethered

__all__ = ("PulsarLite", "PulsarLiteStartError", "start_pulsar_lite")

_READY_WITHIN: Final = 20.0
_STOP_WITHIN: Final = 5.0
_CONFIG: Final = "[metrics]\nenabled = false\n"


class PulsarLiteStartError(RuntimeError):
    """The broker binary was not found, exited on start, or did not accept connections
    in time; the message carries its stderr."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _broker_binary() -> Path:
    try:
        # pulsar-lite ships no type information: import it as a plain module.
        package_file = importlib.import_module("pulsar_lite").__file__
        if package_file is None:
            raise ImportError("pulsar_lite has no __file__")
        binary = Path(package_file).parent / "bin" / "pulsar-lite"
    except ImportError as exc:
        raise PulsarLiteStartError(f"no Pulsar Lite binary (install pulsar-lite): {exc!r}") from exc
    if not binary.is_file():
        raise PulsarLiteStartError(f"no Pulsar Lite binary at {binary}")
    return binary


@final
class PulsarLite:
    """One Pulsar Lite broker process with a fixed loopback port and data directory
    (``workdir``); ``url`` is ``pulsar://127.0.0.1:PORT``. Created stopped: ``start()``."""

    def __init__(self, workdir: Path, *, owns_workdir: bool = False) -> None:
        self.workdir = workdir
        self.db_path = workdir / "db"
        self.config = workdir / "pulsar-lite.toml"
        self.config.write_text(_CONFIG)
        self.port = _free_port()
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self._owns_workdir = owns_workdir
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr_path = workdir / "stderr.log"
        self.paused = False

    def start(self, ready_within: float = _READY_WITHIN) -> None:
        """Start the broker and wait until its port accepts connections. Raises
        ``PulsarLiteStartError`` (with the broker's stderr, the process stopped) if it
        exits or is not reachable within ``ready_within`` seconds."""
        if self._process is not None:
            raise RuntimeError("broker already running")
        binary = _broker_binary()
        command, fds = tethered(
            [
                str(binary),
                "--config",
                str(self.config),
                "--addr",
                f"127.0.0.1:{self.port}",
                "--db-path",
                str(self.db_path),
                "--log-level",
                "warn",
            ]
        )
        with self._stderr_path.open("ab") as stderr:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=self.workdir,
                pass_fds=fds,
            )
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if _accepts(self.port):
                return
            time.sleep(0.02)
        code = self._process.poll()
        self.stop()
        raise PulsarLiteStartError(
            f"Pulsar Lite did not accept connections on port {self.port} within"
            f" {ready_within} s (exit code {code}); stderr:\n{self.stderr()}"
        )

    def pause(self) -> None:
        """Freeze the running broker (SIGSTOP) and return once it is stopped:
        connections stay open, nothing is answered."""
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError("broker not running")
        os.kill(self._process.pid, signal.SIGSTOP)
        self.paused = True
        wait_stopped(self._process.pid)

    def resume(self) -> None:
        """Let a paused broker run again (SIGCONT). Idempotent."""
        if self._process is not None and self.paused and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)  # not a reaped pid, maybe reused
        self.paused = False

    def stop(self) -> None:
        """Stop the broker by its pid: SIGTERM, then SIGKILL after 5 s (a paused broker
        is resumed first). The data directory stays (``start()`` again finds the data).
        Idempotent."""
        self.resume()
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

    def close(self) -> None:
        """Stop the broker, and remove its data directory if ``start_pulsar_lite``
        created it. Idempotent."""
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stderr(self) -> str:
        """What the broker wrote to stderr so far, over all of its runs (the last 8000
        characters)."""
        try:
            return self._stderr_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""


def start_pulsar_lite(
    workdir: Path | None = None, ready_within: float = _READY_WITHIN
) -> PulsarLite:
    """Start a Pulsar Lite broker on a free loopback port, with its data in ``workdir``
    (default: a new temporary directory that ``close()`` removes), and wait until it
    accepts connections. Raises ``PulsarLiteStartError`` (with the broker's stderr, the
    process stopped) if it exits or is not reachable within ``ready_within`` seconds."""
    owns = workdir is None
    directory = Path(tempfile.mkdtemp(prefix="pulsar-lite-")) if workdir is None else workdir
    broker = PulsarLite(directory, owns_workdir=owns)
    try:
        broker.start(ready_within)
    except BaseException:
        if owns:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return broker
