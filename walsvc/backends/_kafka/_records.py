"""How walsvc lays records out in Kafka, and how a reader classifies them.

A data record: value = the envelope's payload; header ``walsvc.h`` = the envelope up to
the payload (fixed header, vchannel, ext); header ``walsvc.o`` = the offset the writer
expected the record to land at (8 bytes, big-endian). A record is *valid* iff it landed
where its writer expected: the offset chain (see ``_writer``). Other record kinds:

- barrier (``walsvc.barrier``): a read-write open; its offset + 1 is the writer's term.
  Header ``walsvc.writer`` names its writer's pid and host (``_identity``; best effort,
  only for the error of the writer it fences; older barriers lack it).
- filler (``walsvc.skip``): occupies the offset of a batch whose outcome was unknown, so
  that batch can never become valid later.
- mark (``walsvc.mark`` + ``walsvc.o``): the writer's newest id and timetick, appended
  before a truncation so they survive it.

Readers deliver valid data records only.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import Enum
from typing import Final, NamedTuple

from walsvc.core._codec import HEADER_SIZE
from walsvc.core._errors import CorruptRecord

__all__ = (
    "BARRIER",
    "EXPECTED",
    "FILLER",
    "Kind",
    "Mark",
    "classify",
    "data_headers",
    "expected_offset",
    "mark_record",
    "split_envelope",
)

EXPECTED: Final = "walsvc.o"
ENVELOPE_HEADER: Final = "walsvc.h"
BARRIER: Final = "walsvc.barrier"
FILLER: Final = "walsvc.skip"
MARK: Final = "walsvc.mark"
_OFFSET = struct.Struct(">q")
_MARK = struct.Struct(">qQ")
_LENGTHS = struct.Struct("<H18xI")  # vchannel length at 12, ext length at 32

Headers = Sequence[tuple[str, bytes | None]]


class Kind(Enum):
    """What a record is to a reader."""

    DATA = "data"  # a valid envelope
    MARK = "mark"  # a valid mark
    BARRIER = "barrier"
    INVALID = "invalid"  # landed elsewhere than expected, or a filler


class Mark(NamedTuple):
    """The newest message id and timetick a writer had when it wrote a mark."""

    latest: int
    timetick: int


def split_envelope(envelope: bytes) -> tuple[bytes, bytes]:
    """(header section, payload) of an encoded envelope."""
    if len(envelope) < HEADER_SIZE:
        raise CorruptRecord("envelope shorter than its fixed header")
    vc_len, ext_len = _LENGTHS.unpack_from(envelope, 12)
    start = HEADER_SIZE + vc_len + ext_len
    return envelope[:start], envelope[start:]


def data_headers(header_section: bytes, expected: int) -> list[tuple[str, bytes]]:
    """The Kafka headers of a data record expected at offset ``expected``."""
    return [(EXPECTED, _OFFSET.pack(expected)), (ENVELOPE_HEADER, header_section)]


def mark_record(mark: Mark, expected: int) -> list[tuple[str, bytes]]:
    """The Kafka headers of a mark record expected at offset ``expected``."""
    return [(EXPECTED, _OFFSET.pack(expected)), (MARK, _MARK.pack(*mark))]


def classify(offset: int, headers: Headers) -> tuple[Kind, bytes | None]:
    """The kind of the record at ``offset`` and, for data and marks, the header value
    that carries it (``walsvc.h`` or ``walsvc.mark``). Raises ``CorruptRecord`` for a
    record walsvc did not write."""
    if len(headers) == 2:  # a data record as data_headers lays it out: the hot path
        (key0, where), (key1, head) = headers
        if key0 == EXPECTED and key1 == ENVELOPE_HEADER:
            expected = expected_offset(where)
            if expected is not None and head is not None:
                return (Kind.DATA, head) if expected == offset else (Kind.INVALID, None)
    where = None
    payload: bytes | None = None
    kind = Kind.DATA
    for key, value in headers:
        if key == EXPECTED:
            where = value
        elif key == ENVELOPE_HEADER:
            payload = value
        elif key == BARRIER:
            return Kind.BARRIER, None
        elif key == FILLER:
            return Kind.INVALID, None
        elif key == MARK:
            kind, payload = Kind.MARK, value
    expected = expected_offset(where)
    if expected is None or payload is None:
        raise CorruptRecord(f"Kafka record at offset {offset} is not a walsvc record")
    if expected != offset:
        return Kind.INVALID, None
    return kind, payload


def expected_offset(where: bytes | None) -> int | None:
    """The offset a ``walsvc.o`` header value names; None if it is not one."""
    if where is None or len(where) != 8:
        return None
    offset: int = _OFFSET.unpack(where)[0]
    return offset


def decode_mark(offset: int, value: bytes) -> Mark:
    """The mark stored in ``value``; ``CorruptRecord`` if it is not one."""
    if len(value) != _MARK.size:
        raise CorruptRecord(f"Kafka record at offset {offset}: bad walsvc mark")
    return Mark(*_MARK.unpack(value))


def data_header(offset: int, head: bytes | Headers) -> bytes | None:
    """The envelope header of the record at ``offset`` if it is a valid data record, else
    None. ``head`` is what ``_batches.walk`` gives: the header itself for a record in the
    plain data layout, else the record's headers (classified here)."""
    if isinstance(head, bytes):
        return head
    kind, header = classify(offset, head)
    return header if kind is Kind.DATA else None
