"""Writing envelopes: messages laid out as the bytes ``_codec`` describes.

The appending side of the envelope (``_codec`` holds the format and the reading of one
envelope, ``_runs`` and ``_columns`` the reading of runs):
``encode`` for any message, and the batch forms the WAL's serialization point uses for
the common messages (no properties, no txn; with or without an idempotency key), which
are compiled when walsvc was built with ``walsvc/core/_speedups.c``. A message too big
for an envelope is ``MessageTooLarge``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from . import _compiled
from ._codec import _CACHE_LIMIT, _HEADER, HEADER_SIZE, VERSION, _Ext
from ._errors import MessageTooLarge
from ._filter import vchannel_hash
from ._ids import MessageId
from ._message import Message, TxnContext

__all__ = (
    "are_keyed",
    "are_plain",
    "encode",
    "encode_keyed_many",
    "encode_plain",
    "encode_plain_many",
    "encode_plain_message",
    "keyed_ext_prefix",
    "last_confirmed_ext",
)

_MAX_TOTAL: Final = 0xFFFF_FFFF
_ext_encode = msgspec.msgpack.Encoder().encode
# The UTF-8 name and header hash of each vchannel a process writes (bounded, as
# ``_codec``'s caches are, against hostile input); the compiled encoders share it.
_vchannel_utf8: dict[str, tuple[bytes, int]] = {}


def encode(
    message: Message,
    *,
    timetick: int,
    term: int,
    last_confirmed: MessageId | None = None,
    txn: TxnContext | None = None,
) -> bytes:
    """Lay ``message`` out as an envelope with the given system fields (``txn`` defaults to
    the message's own)."""
    if txn is None:
        txn = message.txn
    if not message.properties and message.idempotency_key is None and txn is None:
        ext = b"" if last_confirmed is None else last_confirmed_ext(last_confirmed)
        return encode_plain(message.type, message.vchannel, message.payload, timetick, term, ext)
    ext = _ext_encode(
        _Ext(
            dict(message.properties),
            None if last_confirmed is None else last_confirmed.marshal(),
            txn,
            message.idempotency_key,
        )
    )
    return encode_plain(message.type, message.vchannel, message.payload, timetick, term, ext)


def encode_plain(
    type_: int, vchannel: str, payload: bytes, timetick: int, term: int, ext: bytes
) -> bytes:
    """The envelope of a message whose ext section is already encoded: ``b""`` for none,
    ``last_confirmed_ext(id)`` for a message that carries only its last-confirmed id (the
    common message; the WAL encodes it with one call)."""
    cached = _vchannel_utf8.get(vchannel)
    if cached is None:
        cached = _vchannel_entry(vchannel)
    vc_utf8, vc_hash = cached
    total = HEADER_SIZE + len(vc_utf8) + len(ext) + len(payload)
    if total > _MAX_TOTAL:
        raise MessageTooLarge(f"an envelope holds at most {_MAX_TOTAL} bytes; this is {total}")
    header = _HEADER.pack(
        VERSION, 0, type_, total, vc_hash, len(vc_utf8), 0, timetick, term, len(ext)
    )
    return b"".join((header, vc_utf8, ext, payload))


def _vchannel_entry(vchannel: str) -> tuple[bytes, int]:
    """The UTF-8 name and header hash of ``vchannel``, remembered in ``_vchannel_utf8``."""
    utf8 = vchannel.encode()
    entry = (utf8, vchannel_hash(utf8))
    if len(_vchannel_utf8) >= _CACHE_LIMIT:
        _vchannel_utf8.clear()
    _vchannel_utf8[vchannel] = entry
    return entry


def encode_plain_message(
    message: Message, timetick: int, term: int, ext: bytes, limit: int
) -> bytes | None:
    """``encode_plain`` of ``message`` (one without properties, key or txn) with the given
    system fields: the envelope of a single append. None if it would pass ``limit`` bytes
    (``encode_plain`` then tells by how much). Compiled when walsvc was built with
    ``walsvc/core/_speedups.c``."""
    encode_one = _compiled.encode_plain_one
    if encode_one is not None:
        return encode_one(message, timetick, term, ext, limit, _vchannel_utf8, _vchannel_entry)
    record = encode_plain(message.type, message.vchannel, message.payload, timetick, term, ext)
    return record if len(record) <= limit else None


def encode_plain_many(
    messages: list[Message], first_tick: int, term: int, ext: bytes, limit: int
) -> list[bytes] | None:
    """``encode_plain`` of each message (none with properties, key or txn), message i
    with tick ``first_tick + i``: the envelopes of a batch the WAL appends. None if one
    would pass ``limit`` bytes (encode them one by one to learn which). Compiled when
    walsvc was built with ``walsvc/core/_speedups.c``."""
    if _compiled.encode_plain_batch is not None:
        return _compiled.encode_plain_batch(
            messages, first_tick, term, ext, limit, _vchannel_utf8, _vchannel_entry
        )
    records = []
    for tick, message in enumerate(messages, first_tick):
        record = encode_plain(message.type, message.vchannel, message.payload, tick, term, ext)
        if len(record) > limit:
            return None
        records.append(record)
    return records


def are_plain(messages: list[Message], max_payload: int) -> bool:
    """True if every message is a ``Message`` itself (not a subclass) with no properties,
    key or txn and a payload of at most ``max_payload`` bytes: a batch
    ``encode_plain_many`` takes. Compiled when walsvc was built with
    ``walsvc/core/_speedups.c``."""
    if _compiled.are_plain is not None:
        return _compiled.are_plain(messages, max_payload)
    for message in messages:
        if (
            type(message) is not Message
            or message.properties
            or message.idempotency_key is not None
            or message.txn is not None
            or len(message.payload) > max_payload
        ):
            return False
    return True


def are_keyed(messages: list[Message], max_payload: int) -> bool:
    """``are_plain``, but a message may carry an idempotency key: a batch
    ``encode_keyed_many`` takes. Compiled when walsvc was built with
    ``walsvc/core/_speedups.c``."""
    if _compiled.are_keyed is not None:
        return _compiled.are_keyed(messages, max_payload)
    for message in messages:
        if (
            type(message) is not Message
            or message.properties
            or type(message.idempotency_key) not in (str, type(None))
            or message.txn is not None
            or len(message.payload) > max_payload
        ):
            return False
    return True


def encode_keyed_many(
    messages: list[Message], first_tick: int, term: int, ext: bytes, keyed_ext: bytes, limit: int
) -> list[bytes] | None:
    """``encode_plain_many`` for messages that may carry an idempotency key (none with
    properties or txn): a message without one gets ``ext``, one with key k gets
    ``keyed_ext`` (``keyed_ext_prefix`` of the same last-confirmed id) and k, so that each
    envelope is the one ``encode`` lays out. None if one would pass ``limit`` bytes.
    Compiled when walsvc was built with ``walsvc/core/_speedups.c``."""
    if _compiled.encode_keyed_batch is not None:
        return _compiled.encode_keyed_batch(
            messages, first_tick, term, ext, keyed_ext, limit, _vchannel_utf8, _vchannel_entry
        )
    records = []
    for tick, message in enumerate(messages, first_tick):
        key = message.idempotency_key
        record = encode_plain(
            message.type,
            message.vchannel,
            message.payload,
            tick,
            term,
            ext if key is None else keyed_ext + _ext_encode(key),
        )
        if len(record) > limit:
            return None
        records.append(record)
    return records


def keyed_ext_prefix(last_confirmed: MessageId | None) -> bytes:
    """The ext section of a message whose ext fields are its last-confirmed id and an
    idempotency key, without the key (a msgpack str) that ends it."""
    lc = None if last_confirmed is None else last_confirmed.marshal()
    # An empty key is one byte (0xa0), the last: what precedes it is every other key's.
    return _ext_encode(_Ext({}, lc, None, ""))[:-1]


def last_confirmed_ext(last_confirmed: MessageId) -> bytes:
    """The ext section of a message whose only ext field is its last-confirmed id."""
    return _ext_encode(_Ext({}, last_confirmed.marshal()))
