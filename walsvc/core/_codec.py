"""The envelope: how one message is laid out as bytes, the same on every backend.

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
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Final, NoReturn, final

import msgspec

from . import _compiled
from ._budget import DECODE_COST, HEADER_COST, SKIP_COST
from ._errors import CorruptRecord, WALError
from ._filter import Filter, vchannel_hash
from ._ids import MessageId, unmarshal_message_id
from ._message import NO_PROPERTIES, ImmutableMessage, MessageType, TxnContext

__all__ = (
    "HEADER_SIZE",
    "VERSION",
    "EnvelopeHeader",
    "count_run",
    "decode",
    "decode_chunk",
    "decode_run",
    "decode_split",
    "ext_fields",
    "last_timetick_of_run",
    "offset_after",
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


def decode_run(
    data: bytes | memoryview,
    first_seq: int,
    make_id: Callable[[int], MessageId],
    selected: Filter,
    *,
    start: int = 0,
    end: int | None = None,
    skip: int = 0,
) -> list[ImmutableMessage]:
    """Decode the messages ``selected`` admits from a run of envelopes laid end to end.

    The i-th envelope of the run (counting from 0) gets id ``make_id(first_seq + i)``; the
    first ``skip`` envelopes are stepped over. Only headers are read for rejected
    messages. Raises ``CorruptRecord`` if the run is not a whole number of valid envelopes.
    """
    if end is None:
        end = len(data)
    offset = _step_over(data, start, end, skip)
    # Every envelope is at least a header long: end - offset bounds the count.
    units = (end - offset) * DECODE_COST
    return decode_chunk(data, first_seq + skip, make_id, selected, offset, end, units)[0]


#: Records ``decode_chunk`` decodes in Python after the compiled loop made none, before
#: trying it again: runs of records it does not make (with properties, say) then cost it
#: one call in this many.
_ALONE: Final = 16


def _decode_matches(
    data: bytes | memoryview, found: list[int], first_seq: int, make_id: Callable[[int], MessageId]
) -> list[ImmutableMessage]:
    """The messages of the envelopes ``match_hashes`` found (offset, size and place after
    ``first_seq``, three ints each): compiled where ``decode_known`` makes them, else
    ``_decode_at``'s (which learns what was new to the caches, or raises). A match it
    declines is often the first with a new last-confirmed id, and the next match, with
    the same, is made again; after two declines in a row, the next ``_ALONE`` are
    decoded here (matches it never makes, with properties say, then cost it little)."""
    decode_known = _compiled.decode_known
    out: list[ImmutableMessage] = []
    alone = 0  # matches to decode here before the compiled call is tried again
    declined = False  # the last compiled call made nothing
    for i in range(0, len(found), 3):
        at, size, seq = found[i], found[i + 1], first_seq + found[i + 2]
        if decode_known is not None and alone == 0:
            known, _, _ = decode_known(
                data, at, at + size, seq, seq + 1, make_id, ImmutableMessage, _vchannel_str,
                _types, _ext_cache, _last_confirmed_ids, NO_PROPERTIES,
            )  # fmt: skip
            if known:
                out += known
                declined = False
                continue
            alone = _ALONE if declined else 1
            declined = True
        message, _ = _decode_at(data, at, at + size, make_id(seq))
        out.append(message)
        if alone:
            alone -= 1
    return out


def decode_chunk(
    data: bytes | memoryview,
    first_seq: int,
    make_id: Callable[[int], MessageId],
    selected: Filter,
    start: int,
    end: int,
    units: int,
) -> tuple[list[ImmutableMessage], int, int, int]:
    """``decode_run`` from byte ``start`` (that envelope gets id ``make_id(first_seq)``)
    for as long as ``units`` last (see ``_budget``: an envelope decoded costs
    ``DECODE_COST``, one whose header is rejected ``SKIP_COST`` in the compiled walk of a
    vchannel filter and ``HEADER_COST`` in Python, and at least one envelope is
    examined): the messages ``selected`` admits, the offset just past the last envelope
    examined (``end`` once the run is done), the sequence number after it, and the units
    spent. For readers that decode a long run a step at a time."""
    # One loop per filter shape keeps the per-record work of the hot scan to one unpack
    # and one set lookup; this is the loop that bounds replay speed.
    if selected.is_everything:
        return _decode_everything(data, first_seq, make_id, start, end, units)
    if selected.is_floor_only:
        floor = selected.min_timetick
        return _decode_from_floor(data, first_seq, make_id, floor, start, end, units)
    offset = start
    seq = first_seq
    unpack = _SCAN.unpack_from
    out: list[ImmutableMessage] = []
    admits = selected.admits
    hashes = selected.vchannel_hashes
    spent = 0
    if hashes is not None and selected.vchannels_only:
        match_hashes = _compiled.match_hashes
        header_cost = HEADER_COST
        if match_hashes is not None:  # the same walk, compiled; it stops at a bad header
            # It charges SKIP_COST (1) a header and ``extra`` more a match, and returns
            # where its count of units left ended (``left``), after ``examined`` headers.
            found, offset, examined, left = match_hashes(
                data, offset, end, hashes, units, DECODE_COST - SKIP_COST
            )
            out = [m for m in _decode_matches(data, found, first_seq, make_id) if admits(m)]
            seq, spent, header_cost = first_seq + examined, units - left + examined, SKIP_COST
        while offset < end and spent < units:  # all of it, or the bad header it stopped at
            if end - offset < HEADER_SIZE:
                raise CorruptRecord(f"run ends inside a record header at byte {offset}")
            version, _, total, vc_hash = unpack(data, offset)
            if version != VERSION or total < HEADER_SIZE or offset + total > end:
                _raise_bad_record(data, offset, end)
            spent += header_cost
            if vc_hash in hashes:
                message, _ = _decode_at(data, offset, offset + total, make_id(seq))
                if admits(message):
                    out.append(message)
                spent += DECODE_COST - header_cost
            offset += total
            seq += 1
        return out, offset, seq, spent
    prefilter = selected.prefilter
    while offset < end and spent < units:
        if end - offset < HEADER_SIZE:
            raise CorruptRecord(f"run ends inside a record header at byte {offset}")
        version, type_no, total, vc_hash = unpack(data, offset)
        if version != VERSION or total < HEADER_SIZE or offset + total > end:
            _raise_bad_record(data, offset, end)
        spent += HEADER_COST
        if prefilter(type_no, vc_hash, _TIMETICK.unpack_from(data, offset + 16)[0]):
            message, _ = _decode_at(data, offset, offset + total, make_id(seq))
            if admits(message):
                out.append(message)
            spent += DECODE_COST - HEADER_COST
        offset += total
        seq += 1
    return out, offset, seq, spent


def _decode_everything(
    data: bytes | memoryview,
    first_seq: int,
    make_id: Callable[[int], MessageId],
    start: int,
    end: int,
    units: int,
) -> tuple[list[ImmutableMessage], int, int, int]:
    """``decode_chunk`` for a filter that admits everything."""
    offset = start
    seq = first_seq
    out: list[ImmutableMessage] = []
    stop = first_seq + max(1, units // DECODE_COST)
    decode_known = _compiled.decode_known
    alone = 0  # records to decode here before the compiled loop is tried again
    while offset < end and seq < stop:
        # The same loop compiled, for what needs no judgement: 0.56 us per plain
        # record, 0.71 keyed, against 2.4 and 2.9 here (2026-11-29, 20k records).
        if decode_known is not None and alone == 0:
            known, offset, seq = decode_known(
                data, offset, end, seq, stop, make_id, ImmutableMessage, _vchannel_str,
                _types, _ext_cache, _last_confirmed_ids, NO_PROPERTIES,
            )  # fmt: skip
            out += known
            if offset >= end or seq >= stop:
                break
            # It stopped at a record new to the caches (learnt below: try again
            # after it), or, having made nothing, at one it never makes (properties,
            # a transaction's ext): then the next ones are likely the same kind.
            alone = 1 if known else _ALONE
        # What it left: decoded here (its name, type or ext learnt), or raised.
        message, offset = _decode_at(data, offset, end, make_id(seq))
        out.append(message)
        seq += 1
        if alone:
            alone -= 1
    return out, offset, seq, (seq - first_seq) * DECODE_COST


def _decode_from_floor(
    data: bytes | memoryview,
    first_seq: int,
    make_id: Callable[[int], MessageId],
    floor: int,
    start: int,
    end: int,
    units: int,
) -> tuple[list[ImmutableMessage], int, int, int]:
    """``decode_chunk`` for a filter that admits every message with a tick >= ``floor``
    (a read of the log from a tick on: recovery's). The envelopes below it that come
    first are stepped over by their headers; from the first at or above it, the rest
    are decoded as for everything (log order is tick order, so that is usually all of
    them), and the few a damaged order puts below the floor are dropped after."""
    offset = start
    seq = first_seq
    spent = 0
    unpack, tick_at = _SCAN.unpack_from, _TIMETICK.unpack_from
    while offset < end and spent < units:
        if end - offset < HEADER_SIZE:
            raise CorruptRecord(f"run ends inside a record header at byte {offset}")
        version, _, total, _ = unpack(data, offset)
        if version != VERSION or total < HEADER_SIZE or offset + total > end:
            _raise_bad_record(data, offset, end)
        if tick_at(data, offset + 16)[0] >= floor:
            break
        spent += HEADER_COST
        offset += total
        seq += 1
    if offset >= end or spent >= units:
        return [], offset, seq, max(spent, HEADER_COST)
    out, offset, seq, decoded = _decode_everything(data, seq, make_id, offset, end, units - spent)
    if any(message.timetick < floor for message in out):
        out = [message for message in out if message.timetick >= floor]
    return out, offset, seq, spent + decoded


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


def offset_after(data: bytes | memoryview, count: int, start: int = 0) -> int:
    """The offset just past ``count`` envelopes laid end to end from ``start`` (or the end
    of ``data`` if it holds fewer). Raises ``CorruptRecord`` for a bad length."""
    return _step_over(data, start, len(data), count)


def _step_over(data: bytes | memoryview, offset: int, end: int, count: int) -> int:
    """The offset just past ``count`` envelopes starting at ``offset`` (or ``end``)."""
    unpack = _SCAN.unpack_from
    for _ in range(count):
        if offset >= end:
            break
        if end - offset < HEADER_SIZE:
            raise CorruptRecord(f"run ends inside a record header at byte {offset}")
        version, _, total, _ = unpack(data, offset)
        if version != VERSION or total < HEADER_SIZE or offset + total > end:
            _raise_bad_record(data, offset, end)
        offset += total
    return offset


def _raise_bad_record(data: bytes | memoryview, offset: int, end: int) -> NoReturn:
    _unpack_header(data, offset, end)  # raises CorruptRecord naming what is wrong
    raise CorruptRecord(f"bad record at byte {offset}")  # pragma: no cover


def timetick_of(record: bytes | memoryview) -> int:
    """The timetick in an envelope's header (the caller vouches it is an envelope)."""
    tick: int = _TIMETICK.unpack_from(record, 16)[0]
    return tick


def last_timetick_of_run(data: bytes | memoryview) -> int:
    """The timetick of the last envelope in a run laid end to end (0 for an empty run)."""
    unpack = _SCAN.unpack_from
    offset = 0
    last = -1
    end = len(data)
    while offset < end:
        if end - offset < HEADER_SIZE:
            raise CorruptRecord(f"run ends inside a record header at byte {offset}")
        version, _, total, _ = unpack(data, offset)
        if version != VERSION or total < HEADER_SIZE or offset + total > end:
            raise CorruptRecord(f"bad record length or version at byte {offset}")
        last = offset
        offset += total
    return 0 if last < 0 else timetick_of(data[last : last + HEADER_SIZE])


def count_run(data: bytes | memoryview, start: int = 0, end: int | None = None) -> int:
    """The number of envelopes in a run laid end to end, checking only their lengths."""
    if end is None:
        end = len(data)
    unpack = _SCAN.unpack_from
    offset = start
    count = 0
    while offset < end:
        if end - offset < HEADER_SIZE:
            raise CorruptRecord(f"run ends inside a record header at byte {offset}")
        version, _, total, _ = unpack(data, offset)
        if version != VERSION or total < HEADER_SIZE or offset + total > end:
            raise CorruptRecord(f"bad record length or version at byte {offset}")
        offset += total
        count += 1
    return count
