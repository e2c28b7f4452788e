from collections.abc import Callable
from typing import Any

def decode_columns_into(
    data: bytes | memoryview,
    start: int,
    end: int,
    types: list[int],
    vchannels: list[str],
    timeticks: list[int],
    terms: list[int],
    exts: list[bytes],
    payload_starts: list[int],
    ends: list[int],
    known_types: dict[int, Any],
    names: dict[int, tuple[bytes, str]],
    unpack_header: Callable[[bytes | memoryview, int, int], tuple[object, ...]],
    corrupt: type[Exception],
    /,
) -> None: ...
def gather_payloads(
    data: bytes | memoryview, payload_starts: list[int], ends: list[int], /
) -> tuple[bytes, bytes]: ...
def encode_plain_batch(
    messages: list[Any],
    first_tick: int,
    term: int,
    ext: bytes,
    limit: int,
    names: dict[str, tuple[bytes, int]],
    resolve: Callable[[str], tuple[bytes, int]],
    /,
) -> list[bytes] | None: ...
def encode_keyed_batch(
    messages: list[Any],
    first_tick: int,
    term: int,
    ext: bytes,
    keyed_ext: bytes,
    limit: int,
    names: dict[str, tuple[bytes, int]],
    resolve: Callable[[str], tuple[bytes, int]],
    /,
) -> list[bytes] | None: ...
def encode_plain_one(
    message: Any,
    tick: int,
    term: int,
    ext: bytes,
    limit: int,
    names: dict[str, tuple[bytes, int]],
    resolve: Callable[[str], tuple[bytes, int]],
    /,
) -> bytes | None: ...
def numbered_strings(prefix: bytes, first: int, count: int, /) -> tuple[bytes, bytes]: ...
def bind_message(cls: type, /) -> bool: ...
def are_plain(messages: list[Any], max_payload: int, /) -> bool: ...
def are_keyed(messages: list[Any], max_payload: int, /) -> bool: ...
def user_batch_kind(messages: list[Any], system_types: frozenset[Any], /) -> int: ...
def match_hashes(
    data: bytes | memoryview,
    start: int,
    end: int,
    hashes: frozenset[int],
    units: int,
    extra: int,
    /,
) -> tuple[list[int], int, int, int]: ...
def decode_known(
    data: bytes | memoryview,
    start: int,
    end: int,
    seq: int,
    stop: int,
    make_id: Callable[[int], Any],
    message_cls: type,
    vchannels: dict[bytes, tuple[str, int]],
    types: dict[int, Any],
    exts: dict[bytes, tuple[Any, Any]],
    last_confirmed_ids: dict[str, Any],
    no_properties: Any,
    /,
) -> tuple[list[Any], int, int]: ...
