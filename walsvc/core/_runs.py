"""Runs of envelopes laid end to end (a file segment's records, a memory log's): the
messages a filter admits, decoded all at once (``decode_run``) or a step at a time within
a read budget (``decode_chunk``, see ``_budget``), and a run walked by its headers alone
(``offset_after``, ``count_run``, ``last_timetick_of_run``).

Records a filter rejects by their header are never decoded. The walks by headers check
each record's version and length, the decoders all of it; a fault raises
``CorruptRecord``. The loops are compiled when walsvc was built with
``walsvc/core/_speedups.c`` (``walsvc.core._compiled``), else run in Python; the compiled
ones share ``_codec``'s caches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NoReturn

from . import _compiled
from ._budget import DECODE_COST, HEADER_COST, SKIP_COST
from ._codec import (
    _SCAN,
    _TIMETICK,
    HEADER_SIZE,
    VERSION,
    _decode_at,
    _ext_cache,
    _last_confirmed_ids,
    _types,
    _unpack_header,
    _vchannel_str,
    timetick_of,
)
from ._errors import CorruptRecord
from ._filter import Filter
from ._ids import MessageId
from ._message import NO_PROPERTIES, ImmutableMessage

__all__ = (
    "count_run",
    "decode_chunk",
    "decode_run",
    "last_timetick_of_run",
    "offset_after",
)


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
