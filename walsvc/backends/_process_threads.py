"""Thread pools of the process for the backends' blocking calls (the file writers'
worker threads, pulsar-client's synchronous calls), made on first use and made anew in a
forked child (a child inherits the pool object but not its threads)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import final

__all__ = ("ProcessThreads",)


@final
class ProcessThreads:
    """``size`` threads named ``name``_N, shared by the process. The threads are not
    daemons: at exit the interpreter waits for a call in flight rather than tear a
    thread down inside it (inside pulsar-client's C++ code, or a file write)."""

    __slots__ = ("_executor", "_name", "_pid", "_size")

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    def executor(self) -> ThreadPoolExecutor:
        """The pool, made on first use in this process."""
        if self._executor is None or self._pid != os.getpid():
            self._executor = ThreadPoolExecutor(self._size, thread_name_prefix=self._name)
            self._pid = os.getpid()
        return self._executor
