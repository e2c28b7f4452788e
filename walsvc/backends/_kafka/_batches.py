"""The records of a Kafka fetch response, read straight from its bytes.

``walk`` turns the record batches of one partition's fetch response into one tuple per
record, ``(offset, head, value)``: for a walsvc data record whose ``walsvc.o`` header
names its own offset (the common record), ``head`` is its ``walsvc.h`` header value
(bytes); for any other record it is the list of its headers, for ``_records.classify``.
A scanner needs nothing more, so no ``ConsumerRecord`` is built per record: aiokafka's
consumer spends about two thirds of its CPU per message on those.

Batches in message format v2 without compression (what walsvc's writer produces) are
walked by the compiled loop ``_cbatches.walk``; any other batch (compressed, an older
format), and every batch where walsvc was built without a C compiler, by aiokafka's own
parser. Both check each batch's CRC and raise ``CorruptRecord`` for a mismatch or a
record that does not fit its batch; tests hold the two to the same output.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

import crc32c as _crc32c
from aiokafka.record.memory_records import MemoryRecords

from walsvc.core._errors import CorruptRecord

from ._records import ENVELOPE_HEADER, EXPECTED, expected_offset

__all__ = ("Walked", "walk", "walk_batches_in_python")

#: (offset, walsvc.h header value or the record's headers, value)
Walked = tuple[int, "bytes | list[tuple[str, bytes | None]]", "bytes | None"]

_BATCH_START = struct.Struct(">qi")  # base offset, batch length
_BATCH_OVERHEAD: Final = 12  # base offset + batch length
_MAGIC_AT: Final = 16
_MIN_BATCH: Final = 61 - _BATCH_OVERHEAD  # a v2 batch header after its length field

_compiled_walk: Callable[..., tuple[int, int]] | None
try:
    from . import _cbatches
except ImportError:  # built without a C compiler
    _compiled_walk = None
else:
    _compiled_walk = _cbatches.walk


def walk(data: bytes, fetch_offset: int) -> tuple[list[Walked], int]:
    """The records of ``data`` (one partition's record batches, as a fetch response holds
    them) whose offset is at least ``fetch_offset``, in log order, and the offset to
    fetch next: after the last whole batch, or ``fetch_offset`` if ``data`` holds none
    (a batch the response holds only part of is left for the next fetch)."""
    out: list[Walked] = []
    if _compiled_walk is None:
        return out, walk_batches_in_python(data, 0, fetch_offset, fetch_offset, out)[1]
    pos, next_offset = 0, fetch_offset
    while True:
        pos, next_offset = _compiled_walk(
            data, pos, fetch_offset, next_offset, _crc32c.crc32c, CorruptRecord, out
        )
        end = _whole_batch_end(data, pos)
        if end is None:
            return out, next_offset
        # A batch the compiled walk does not read (compressed, an older format).
        next_offset = _parse_batch(memoryview(data)[pos:end], fetch_offset, next_offset, out)
        pos = end


def walk_batches_in_python(
    data: bytes, pos: int, fetch_offset: int, next_offset: int, out: list[Walked]
) -> tuple[int, int]:
    """What ``_cbatches.walk`` does, batch by batch with aiokafka's parser: append the
    records of the whole batches in ``data[pos:]`` to ``out`` and return (where the walk
    stopped, the offset after the last batch)."""
    view = memoryview(data)
    while (end := _whole_batch_end(data, pos)) is not None:
        next_offset = _parse_batch(view[pos:end], fetch_offset, next_offset, out)
        pos = end
    return pos, next_offset


def _whole_batch_end(data: bytes, pos: int) -> int | None:
    """Where the batch at ``pos`` ends, or None if ``data`` does not hold all of it.
    Raises ``CorruptRecord`` for a length no batch can have (the compiled walk's rules)."""
    if len(data) - pos < _BATCH_OVERHEAD:
        return None
    base_offset: int
    length: int
    base_offset, length = _BATCH_START.unpack_from(data, pos)
    if length < 0:
        raise CorruptRecord(f"Kafka record batch at offset {base_offset}: negative batch length")
    end = pos + _BATCH_OVERHEAD + length
    if end > len(data):
        return None
    if length <= _MAGIC_AT - _BATCH_OVERHEAD:
        raise CorruptRecord(
            f"Kafka record batch at offset {base_offset}: batch too short for its magic byte"
        )
    if length < _MIN_BATCH and data[pos + _MAGIC_AT] == 2:
        raise CorruptRecord(f"Kafka record batch at offset {base_offset}: batch length too small")
    return end


def _parse_batch(batch: memoryview, fetch_offset: int, next_offset: int, out: list[Walked]) -> int:
    """Append the records of one whole batch to ``out`` with aiokafka's parser; return the
    offset after it (at least ``next_offset``)."""
    base_offset = _BATCH_START.unpack_from(batch)[0]
    try:
        parsed: Any = MemoryRecords(bytes(batch)).next_batch()
        if parsed is None or not parsed.validate_crc():
            raise CorruptRecord(f"Kafka record batch at offset {base_offset}: CRC-32C mismatch")
        if not getattr(parsed, "is_control_batch", False):
            out.extend(
                _walked(record.offset, list(record.headers), record.value)
                for record in parsed
                if record.offset >= fetch_offset
            )
        after: int = parsed.next_offset
    except CorruptRecord:
        raise
    except Exception as exc:  # aiokafka's parser on bytes that are not a valid batch
        raise CorruptRecord(f"Kafka record batch at offset {base_offset}: {exc}") from exc
    return max(next_offset, after)


def _walked(offset: int, headers: list[tuple[str, bytes | None]], value: bytes | None) -> Walked:
    """The tuple of one record, in the form the compiled walk gives it."""
    if len(headers) == 2:
        (key0, where), (key1, head) = headers
        if (
            key0 == EXPECTED
            and key1 == ENVELOPE_HEADER
            and head is not None
            and expected_offset(where) == offset
        ):
            return offset, head, value
    return offset, headers, value
