from typing import Any

def bind(
    message_cls: type, txn_cls: type, sequence_id_cls: type, producer_prefix: str, /
) -> bool: ...
def encode_delivered(
    stream: int, messages: list[Any], schemes: dict[type, bytes], /
) -> bytes | None: ...
