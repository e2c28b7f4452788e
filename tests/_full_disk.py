"""A real full disk for tests: a small tmpfs mounted where the machine allows it (root in
a sandbox that permits ``mount``), filled to the last byte.

``small_filesystem(path)`` mounts one at ``path`` and yields True, or yields False when
the machine refuses the mount (or ``WALSVC_TEST_NO_MOUNT`` is set); tests then inject
``OSError(ENOSPC)`` at the same calls instead, so they run (never skip) on every machine.
``fill(path)`` writes a file until the file system refuses more and returns it (unlink it
to free the space).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ("fill", "small_filesystem")


@contextmanager
def small_filesystem(path: Path, size: str = "4m") -> Iterator[bool]:
    path.mkdir(parents=True, exist_ok=True)
    if os.environ.get("WALSVC_TEST_NO_MOUNT"):  # to run the fallback where mounts work
        yield False
        return
    try:
        mounted = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(path: Path) -> Path:
    ballast = path / "ballast"
    chunk = b"\xa5" * 65536
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[:4096]
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return ballast
                chunk = chunk[: max(1, len(chunk) // 16)]
    finally:
        os.close(fd)
