"""A walsvc node in a subprocess (``python -m walsvc serve``), for tests that need real
processes and real sockets: it reads the bound port from the node's first line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from walsvc.testing._tether import tethered

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def node_serving(kind: str, scratch: Path) -> Iterator[str]:
    """Start a node serving a fresh ``memory://`` log (``kind`` "memory") or a
    ``file://`` log in the empty directory ``scratch`` ("file"); yield its walsvc://
    URL."""
    url = f"memory://node-{uuid.uuid4().hex[:8]}" if kind == "memory" else f"file://{scratch}"
    with node_process(url) as (node_url, _):
        yield node_url


@contextmanager
def node_process(
    url: str, *extra: str, env: dict[str, str] | None = None, log: list[str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Start a node serving ``url`` on a free loopback port; yield its ``walsvc://`` URL
    and the process; kill it at exit. The node's log (stderr) is read on a thread as it
    comes, line by line into ``log`` if given: a node that logs much never blocks on a
    full pipe. The thread has read it all once this exits."""
    command, fds = tethered(
        [sys.executable, "-m", "walsvc", "serve", "--url", url, "--listen", "127.0.0.1:0", *extra]
    )
    process = subprocess.Popen(
        command,
        pass_fds=fds,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    reader: threading.Thread | None = None
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if " at walsvc://" not in line:
            process.kill()
            raise AssertionError(f"the node did not start: {line!r} {process.communicate()[1]}")
        reader = threading.Thread(
            target=_read_lines, args=(process.stderr, [] if log is None else log), daemon=True
        )
        reader.start()
        yield line.rsplit(" at ", 1)[1].strip(), process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if reader is not None:
            reader.join(10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _read_lines(stream: IO[str], lines: list[str]) -> None:
    for line in stream:
        lines.append(line)  # noqa: PERF402 (the test watches the list grow meanwhile)


class RestartableNode:
    """A node process on the log at ``log_url`` (started with the flags ``extra``) that a
    test can ``kill -9`` and start again on the same log; ``url`` is where the current
    one listens."""

    def __init__(self, log_url: str, *extra: str) -> None:
        self.log_url = log_url
        self._extra = extra
        self._stack = contextlib.ExitStack()
        self.url, self.process = self._start()

    def _start(self) -> tuple[str, subprocess.Popen[str]]:
        return self._stack.enter_context(node_process(self.log_url, *self._extra))

    def kill_and_restart(self) -> str:
        """Kill the node (SIGKILL), start a new one on the same log; return its URL."""
        self.process.kill()
        self.process.wait()
        self.url, self.process = self._start()
        return self.url

    def close(self) -> None:
        """Stop the node."""
        self._stack.close()
