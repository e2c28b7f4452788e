from collections.abc import Callable

def walk(
    data: bytes,
    pos: int,
    fetch_offset: int,
    next_offset: int,
    crc32c: Callable[[memoryview], int],
    corrupt: type[Exception],
    out: list[tuple[int, object, bytes | None]],
    /,
) -> tuple[int, int]: ...
