from typing import Final

OK: Final[int]
FENCED: Final[int]
BAD_HEAD: Final[int]
OS_ERROR: Final[int]

class Committer:
    @property
    def syncs(self) -> int: ...
    @property
    def running(self) -> bool: ...
    @property
    def threads_started(self) -> int: ...
    def __init__(
        self, head_fd: int, term: int, notify_fd: int, idle_timeout: float = ...
    ) -> None: ...
    def commit(
        self,
        data_fd: int,
        data: bytes,
        offset: int,
        sync: bool,
        durable_end: int,
        last_timetick: int,
        segment: int,
        /,
    ) -> None: ...
    def outcome(self) -> tuple[int, int]: ...
    def close(self) -> None: ...

def crc32c(data: bytes | memoryview, /) -> int: ...
