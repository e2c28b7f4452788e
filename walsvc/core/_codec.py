"""The envelope: how one message is laid out as bytes, the same on every backend, and
the reading of one envelope.

Version 1, little-endian, a 36-byte fixed header followed by three variable parts::

    offset size  field
    0      1     version (1)
    1      1     flags (0; reserved)
    2      2     message type
    4      4     total length of the envelope, header included
    8      4     vchannel hash (CRC-32 of the UTF-8 name, 0 for the broadcast vchannel "")
    12     2     vchannel length in bytes
    14     2     reserved (0)
    16     8     timetick
    24     8     writer term
    32     4     ext length
    36     ...   vchannel (UTF-8) | ext (msgpack: properties, last-confirmed, txn, key) | payload

Every later version keeps bytes 0-11 where they are, so a scan can skip or reject records
by length, type and vchannel hash without decoding anything else. The payload is never
decoded; ``peek`` returns it as a zero-copy memoryview.

One envelope is read here (``peek``, ``decode``, ``decode_split``, ``ext_fields``,
``timetick_of``); runs of envelopes laid end to end are read by ``_runs`` (as messages)
and ``_columns`` (as columns), and ``_encode`` writes envelopes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final, final

import msgspec

from ._errors import CorruptRecord, WALError
from ._filter import vchannel_hash
from ._ids import MessageId, unmarshal_message_id
from ._message import NO_PROPERTIES, ImmutableMessage, MessageType, TxnContext

__all__ = (
    "HEADER_SIZE",
    "VERSION",
    "EnvelopeHeader",
    "decode",
    "decode_split",
    "ext_fields",
    "peek",
    "timetick_of",
)

#: The envelope format version every record's first byte carries.
VERSION: Final = 1
_HEADER = struct.Struct("<BBHIIHHQQI")
#: Bytes of an envelope's fixed header (36): no envelope is shorter.
HEADER_SIZE: Final = _HEADER.size
_SCAN = struct.Struct("<BxHII")  # version, type, total length, vchannel hash
_TIMETICK = struct.Struct("<Q")


class _Ext(msgspec.Struct, array_like=True, omit_defaults=True):
    properties: dict[str, str] = {}
    last_confirmed: str | None = None
    txn: TxnContext | None = None
    idempotency_key: str | None = None


_ext_decode = msgspec.msgpack.Decoder(_Ext).decode
# Shared by every message without properties; ImmutableMessage.properties is read-only.

# Small caches for the few vchannel names a process sees; bounded against hostile input.
_CACHE_LIMIT = 4096
_vchannel_str: dict[bytes, tuple[str, int]] = {}
_types: dict[int, MessageType] = {t.value: t for t in MessageType}


@final
class EnvelopeHeader(msgspec.Struct, frozen=True):
    """The header of an encoded message, read without touching its payload.

    ``payload`` is a memoryview into the buffer ``peek`` was given (no copy).
    """

    type: MessageType
    vchannel: str
    timetick: int
    term: int
    payload: memoryview


def _unpack_header(
    data: bytes | memoryview, offset: int, end: int
) -> tuple[MessageType, str, int, int, int, int, int]:
    """Validate the header at ``offset`` and return (type, vchannel, timetick, term,
    ext_start, payload_start, record_end)."""
    if end - offset < HEADER_SIZE:
        raise CorruptRecord(f"record header truncated: {end - offset} of {HEADER_SIZE} bytes")
    version, flags, type_no, total, vc_hash, vc_len, reserved, timetick, term, ext_len = (
        _HEADER.unpack_from(data, offset)
    )
    if version != VERSION:
        raise CorruptRecord(f"unknown envelope version {version} (this walsvc reads {VERSION})")
    if flags or reserved:
        raise CorruptRecord("reserved envelope header bits are set")
    record_end = offset + total
    ext_start = offset + HEADER_SIZE + vc_len
    payload_start = ext_start + ext_len
    if total < HEADER_SIZE or record_end > end or payload_start > record_end:
        raise CorruptRecord(
            f"envelope lengths do not fit: total {total}, vchannel {vc_len}, ext {ext_len},"
            f" {end - offset} bytes available"
        )
    vc_bytes = bytes(data[offset + HEADER_SIZE : ext_start])
    cached = _vchannel_str.get(vc_bytes)
    if cached is None:
        try:
            cached = (vc_bytes.decode(), vchannel_hash(vc_bytes))
        except UnicodeDecodeError:
            raise CorruptRecord("vchannel name is not valid UTF-8") from None
        if len(_vchannel_str) >= _CACHE_LIMIT:
            _vchannel_str.clear()
        _vchannel_str[vc_bytes] = cached
    vchannel, expected_hash = cached
    if expected_hash != vc_hash:
        raise CorruptRecord("vchannel hash does not match the vchannel name")
    type_ = _types.get(type_no)
    if type_ is None:
        try:
            type_ = MessageType(type_no)
        except ValueError:
            raise CorruptRecord(f"unknown message type {type_no}") from None
        _types[type_no] = type_
    return type_, vchannel, timetick, term, ext_start, payload_start, record_end


def peek(data: bytes | memoryview) -> EnvelopeHeader:
    """Read the header of one envelope (the whole of ``data``) without copying its payload.

    Raises ``CorruptRecord`` if ``data`` is not exactly one valid envelope header and body.
    """
    view = memoryview(data)
    type_, vchannel, timetick, term, _, payload_start, end = _unpack_header(view, 0, len(view))
    if end != len(view):
        raise CorruptRecord(f"{len(view) - end} stray bytes after the envelope")
    return EnvelopeHeader(type_, vchannel, timetick, term, view[payload_start:end])


def _decode_at(
    data: bytes | memoryview, offset: int, end: int, message_id: MessageId
) -> tuple[ImmutableMessage, int]:
    type_, vchannel, timetick, term, ext_start, payload_start, record_end = _unpack_header(
        data, offset, end
    )
    payload = bytes(data[payload_start:record_end])
    message = _message(
        data, ext_start, payload_start, message_id, type_, vchannel, timetick, term, payload
    )
    return message, record_end


def decode_split(header: bytes, payload: bytes, message_id: MessageId) -> ImmutableMessage:
    """Decode an envelope stored in two parts, as brokers carry it: ``header`` (the
    envelope up to its payload: fixed header, vchannel, ext) and ``payload``, which the
    message keeps as is (no copy). Raises ``CorruptRecord`` unless the two make exactly
    one valid envelope."""
    size = len(header) + len(payload)
    if len(header) < HEADER_SIZE:
        raise CorruptRecord(f"record header truncated: {len(header)} of {HEADER_SIZE} bytes")
    # The hot path: a vchannel and ext seen before (brokers' records repeat a few
    # vchannels and one last-confirmed id for long runs) cost one unpack and one lookup.
    version, flags, type_no, total, vc_hash, vc_len, reserved, tick, term, ext_len = (
        _HEADER.unpack_from(header)
    )
    tail = header[HEADER_SIZE:]
    known = _split_tails.get(tail)
    if (
        known is not None
        and known[0] == vc_len
        and known[1] == vc_hash
        and (known[3] is None or type(known[3]) is type(message_id))
        and version == VERSION
        and not flags
        and not reserved
        and total == size
        and HEADER_SIZE + vc_len + ext_len == len(header)
        and type_no in _types
    ):
        return ImmutableMessage(
            message_id,
            tick,
            known[2],
            _types[type_no],
            payload,
            NO_PROPERTIES,
            known[3],
            known[4],
            None,
            term,
        )
    type_, vchannel, timetick, term, ext_start, payload_start, end = _unpack_header(header, 0, size)
    if payload_start != len(header) or end != size:
        raise CorruptRecord(
            f"envelope header says {payload_start} header and {end - payload_start} payload"
            f" bytes; the record has {len(header)} and {len(payload)}"
        )
    message = _message(
        header, ext_start, payload_start, message_id, type_, vchannel, timetick, term, payload
    )
    if not message.properties and message.idempotency_key is None:
        if len(_split_tails) >= _CACHE_LIMIT:
            _split_tails.clear()
        _split_tails[tail] = (vc_len, vc_hash, vchannel, message.last_confirmed_id, message.txn)
    return message


#: decode_split's memory: the bytes after the fixed header (vchannel and ext) of headers
#: without properties or key -> (vchannel length, vchannel hash, vchannel,
#: last-confirmed id, txn context).
_split_tails: dict[bytes, tuple[int, int, str, MessageId | None, TxnContext | None]] = {}


def _message(
    data: bytes | memoryview,
    ext_start: int,
    payload_start: int,
    message_id: MessageId,
    type_: MessageType,
    vchannel: str,
    timetick: int,
    term: int,
    payload: bytes,
) -> ImmutableMessage:
    """The message of an envelope whose header is unpacked: decode its ext section."""
    if payload_start != ext_start:
        properties, last_confirmed, txn, key = _ext_of(
            bytes(data[ext_start:payload_start]), type(message_id)
        )
    else:
        properties, last_confirmed, txn, key = NO_PROPERTIES, None, None, None
    return ImmutableMessage(
        message_id,
        timetick,
        vchannel,
        type_,
        payload,
        properties,
        last_confirmed,
        txn,
        key,
        term,
    )


_ext_cache: dict[bytes, tuple[MessageId | None, TxnContext | None]] = {}


def _ext_of(
    raw_ext: bytes, id_class: type[MessageId]
) -> tuple[Mapping[str, str], MessageId | None, TxnContext | None, str | None]:
    """``_decode_ext``, remembered for exts without properties or key: runs of messages
    share one last-confirmed id (and a transaction's body its context), so each distinct
    ext is decoded once."""
    cached = _ext_cache.get(raw_ext)
    if cached is not None and (cached[0] is None or type(cached[0]) is id_class):
        return NO_PROPERTIES, cached[0], cached[1], None
    properties, last_confirmed, txn, key = decoded = _decode_ext(raw_ext, id_class)
    if not properties and key is None:
        if len(_ext_cache) >= _CACHE_LIMIT:
            _ext_cache.clear()
        _ext_cache[raw_ext] = (last_confirmed, txn)
    return decoded


#: Last-confirmed ids by their text, for the exts ``_ext_cache`` does not keep: a keyed
#: message's ext is its own (every remote append carries a producer key), but runs of
#: messages share one last-confirmed id, parsed once here.
_last_confirmed_ids: dict[str, MessageId] = {}


def _decode_ext(
    raw_ext: bytes, id_class: type[MessageId]
) -> tuple[Mapping[str, str], MessageId | None, TxnContext | None, str | None]:
    try:
        ext = _ext_decode(raw_ext)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        # ValueError includes UnicodeDecodeError from a damaged string.
        raise CorruptRecord(f"envelope ext section does not decode: {exc}") from None
    last_confirmed = None
    text = ext.last_confirmed
    if text is not None:
        last_confirmed = _last_confirmed_ids.get(text)
        if last_confirmed is None:
            try:
                last_confirmed = unmarshal_message_id(text)
            except WALError as exc:
                raise CorruptRecord(f"envelope last-confirmed id is not valid: {exc}") from None
            if len(_last_confirmed_ids) >= _CACHE_LIMIT:
                _last_confirmed_ids.clear()
            _last_confirmed_ids[text] = last_confirmed
        if type(last_confirmed) is not id_class:
            raise CorruptRecord(
                f"last-confirmed id {ext.last_confirmed!r} is not an id of this log"
            )
    return ext.properties or NO_PROPERTIES, last_confirmed, ext.txn, ext.idempotency_key


def decode(data: bytes | memoryview, message_id: MessageId) -> ImmutableMessage:
    """Decode one envelope (the whole of ``data``) into the message stored at
    ``message_id``. Raises ``CorruptRecord`` for anything but one valid envelope."""
    message, end = _decode_at(data, 0, len(data), message_id)
    if end != len(data):
        raise CorruptRecord(f"{len(data) - end} stray bytes after the envelope")
    return message


def ext_fields(
    raw_ext: bytes, id_class: type[MessageId]
) -> tuple[Mapping[str, str], TxnContext | None]:
    """The properties and transaction context of an ext section (``b""``: none) of a
    message of a log whose ids are ``id_class``. Raises ``CorruptRecord`` as decoding
    the whole message would."""
    if not raw_ext:
        return NO_PROPERTIES, None
    properties, _, txn, _ = _ext_of(raw_ext, id_class)
    return properties, txn


def timetick_of(record: bytes | memoryview) -> int:
    """The timetick in an envelope's header (the caller vouches it is an envelope)."""
    tick: int = _TIMETICK.unpack_from(record, 16)[0]
    return tick
