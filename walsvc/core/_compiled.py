"""The loops compiled from ``walsvc/core/_speedups.c``, each None when walsvc was built without
a C compiler: callers then run the same loop in Python (see each caller)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = (
    "are_keyed",
    "are_plain",
    "decode_columns_into",
    "decode_known",
    "encode_keyed_batch",
    "encode_plain_batch",
    "encode_plain_one",
    "gather_payloads",
    "match_hashes",
    "numbered_strings",
    "user_batch_kind",
)

decode_columns_into: Callable[..., None] | None
decode_known: Callable[..., tuple[list[Any], int, int]] | None
gather_payloads: Callable[[bytes | memoryview, list[int], list[int]], tuple[bytes, bytes]] | None
encode_plain_batch: Callable[..., list[bytes] | None] | None
encode_keyed_batch: Callable[..., list[bytes] | None] | None
encode_plain_one: Callable[..., bytes | None] | None
numbered_strings: Callable[[bytes, int, int], tuple[bytes, bytes]] | None
match_hashes: (
    Callable[
        [bytes | memoryview, int, int, frozenset[int], int, int], tuple[list[int], int, int, int]
    ]
    | None
)
are_plain: Callable[[list[Any], int], bool] | None
are_keyed: Callable[[list[Any], int], bool] | None
user_batch_kind: Callable[[list[Any], frozenset[Any]], int] | None

try:
    from . import _speedups
except ImportError:
    decode_columns_into = gather_payloads = numbered_strings = match_hashes = None
    decode_known = None
    encode_plain_batch = encode_plain_one = are_plain = None
    encode_keyed_batch = are_keyed = user_batch_kind = None
else:
    decode_columns_into = _speedups.decode_columns_into
    decode_known = _speedups.decode_known
    gather_payloads = _speedups.gather_payloads
    encode_plain_batch = _speedups.encode_plain_batch
    encode_plain_one = _speedups.encode_plain_one
    numbered_strings = _speedups.numbered_strings
    match_hashes = _speedups.match_hashes
    # The message encoders read walsvc.Message's fields from their slots once bound; if
    # binding fails they read them by name, and are_plain cannot answer (nor can
    # are_keyed, and encode_keyed_batch, which reads the key from its slot, is not used).
    from ._message import Message

    if _speedups.bind_message(Message):
        are_plain = _speedups.are_plain
        are_keyed = _speedups.are_keyed
        encode_keyed_batch = _speedups.encode_keyed_batch
        user_batch_kind = _speedups.user_batch_kind
    else:
        are_plain = are_keyed = encode_keyed_batch = user_batch_kind = None


def available() -> dict[str, Any]:
    """Which compiled loops this build has (for diagnostics and tests)."""
    return {name: globals()[name] is not None for name in __all__}
