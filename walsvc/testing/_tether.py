"""Programs that die with the process that started them.

A test's broker or node must not outlive the test process, however that process ends:
a pytest worker that crashes in native code, or a benchmark that asv kills, runs no
teardown, and its brokers would run on for ever (seen: ten Tansu and two Pulsar Lite
processes after three crashed runs). ``tethered(argv)`` returns the command to start
instead, with the file descriptors to pass to ``subprocess.Popen``:

    command, fds = tethered([binary, *args])
    process = subprocess.Popen(command, pass_fds=fds, ...)

The started process becomes the program itself (same pid: ``Popen``'s signals, waits and
SIGSTOP/SIGCONT reach it), after it forks a small watcher. The watcher blocks on a pipe
whose only write end this process holds and never writes to; when this process dies the
kernel closes it, the watcher reads end-of-file and kills the program (SIGKILL, which
also ends a paused one). ``PR_SET_PDEATHSIG`` ends the watcher when the program ends.

Why not ``PR_SET_PDEATHSIG`` on the program alone: it fires when the *thread* that
started the program exits, and tests restart brokers and nodes from executor threads.
The pipe is tied to the process, not to a thread. Linux only; elsewhere ``tethered``
returns the command unchanged.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import Final

__all__ = ("tethered",)

# Run by a bare interpreter (-I -S: no site, no environment), so it starts fast and
# imports nothing of walsvc. argv: the pipe's read end, then the program's command.
_WATCH: Final = r"""
import os, signal, sys
fd, command = int(sys.argv[1]), sys.argv[2:]
program = os.getpid()
if os.fork() == 0:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the program
    null = os.open(os.devnull, os.O_RDWR)  # not the program's pipes: their readers
    for std in (0, 1, 2):  # see end-of-file when the program ends, not the watcher
        os.dup2(null, std)
    import ctypes
    if ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        os._exit(1)
    if os.getppid() == program:  # else the program is gone already
        try:
            while os.read(fd, 64):
                pass
        except OSError:
            pass
        os.kill(program, signal.SIGKILL)
    os._exit(0)
os.close(fd)
os.execvp(command[0], command)
"""

_lock = threading.Lock()
#: This process's tether pipe (read end, write end), made on first use.
_pipe: tuple[int, int] | None = None


def _pipe_read_end() -> int:
    """The read end of this process's tether pipe. The write end stays open, unwritten,
    until the process dies; both ends are non-inheritable, so only the children given
    the read end (``pass_fds``) hold it."""
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = os.pipe()
        return _pipe[0]


def _forget_parents_pipe() -> None:
    """In a child forked without exec: its copy of the parent's write end would keep
    the parent's programs alive after the parent died; close it, and tether this
    process's own programs to a pipe of its own."""
    global _lock, _pipe
    _lock = threading.Lock()  # a thread of the parent may have held it at the fork
    if _pipe is not None:
        for fd in _pipe:
            os.close(fd)
        _pipe = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parents_pipe)


def tethered(argv: Sequence[str]) -> tuple[list[str], tuple[int, ...]]:
    """The command that runs ``argv`` as a program killed (SIGKILL) when this process
    dies, and the file descriptors to pass to ``subprocess.Popen`` (``pass_fds``). The
    started process is the program (``execvp`` of ``argv``, searched on PATH)."""
    if not argv:
        raise ValueError("tethered() needs a command")
    if not sys.platform.startswith("linux"):
        return list(argv), ()
    fd = _pipe_read_end()
    return [sys.executable, "-I", "-S", "-c", _WATCH, str(fd), *argv], (fd,)
