from typing import Any

def bind(
    message_cls: type,
    wire_result_cls: type,
    append_result_cls: type,
    ids_cls: type,
    system_types: Any,
    producer_prefix: str,
    /,
) -> bool: ...
def encode_append_many(
    request: int, wal: int, messages: list[Any], prefix: str, next_key: int, /
) -> tuple[bytes, int] | None: ...
def encode_append(
    request: int, wal: int, message: Any, prefix: str, next_key: int, /
) -> tuple[bytes, int] | None: ...
def results_of(
    wire_results: list[Any], classes: dict[str, type], lc_ids: Any, /
) -> list[Any] | None: ...
def bind_delivered(
    wire_delivered_cls: type, message_cls: type, types: dict[int, Any], /
) -> bool: ...
def delivered_of(
    wire_delivered: list[Any], classes: dict[str, type], lc_ids: Any, /
) -> list[Any] | None: ...
