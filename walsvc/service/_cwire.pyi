from typing import Any

def bind(
    message_cls: type,
    txn_cls: type,
    sequence_id_cls: type,
    producer_prefix: str,
    result_cls: type,
    append_cls: type,
    wire_cls: type,
    type_cls: type,
    max_vchannel_bytes: int,
    /,
) -> bool: ...
def encode_delivered(
    stream: int, messages: list[Any], schemes: dict[type, bytes], /
) -> bytes | None: ...
def encode_appended(
    request: int, results: list[Any], schemes: dict[type, bytes], /
) -> bytes | None: ...
def encode_appended_each(
    requests: list[int], outcomes: list[Any], schemes: dict[type, bytes], /
) -> list[bytes | None] | None: ...
def messages_of(wires: list[Any], types: dict[int, Any], /) -> list[Any] | None: ...
def charge_of(wires: list[Any], /) -> int: ...
