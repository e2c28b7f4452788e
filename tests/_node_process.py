"""A walsvc node in a subprocess (``python -m walsvc serve``), for tests that need real
processes and real sockets: it reads the bound port from the node's first line."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    url: str, *extra: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Start a node serving ``url`` on a free loopback port; yield its ``walsvc://`` URL
    and the process (stderr is captured: the node's log); kill it at exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "walsvc", "serve", "--url", url, "--listen", "127.0.0.1:0", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if " at walsvc://" not in line:
            process.kill()
            raise AssertionError(f"the node did not start: {line!r} {process.communicate()[1]}")
        yield line.rsplit(" at ", 1)[1].strip(), process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
