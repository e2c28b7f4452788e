"""On-disk layout of the local log.

A pchannel is a directory holding a ``head`` file and segment files named by the
sequence number of their first record (``00000000000000000042.seg``). A segment is a run
of frames; a frame is what one group commit wrote::

    frame header, 24 bytes, little-endian
    0   4  magic b"WALF"
    4   4  CRC32C of bytes 8..24 of the header and of the body
    8   4  body length
    12  4  record count
    16  8  sequence number of the first record
    24  .. body: ``count`` envelopes laid end to end (see walsvc.core._codec)

One CRC covers a whole batch, so checksumming costs GiB/s rather than a call per record.
A frame that fails its checks at the very end of the newest segment is a torn write and is
cut off on open; anywhere else it is corruption and raises ``CorruptRecord``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from crc32c import crc32c

from walsvc.core._errors import CorruptRecord

__all__ = (
    "FRAME_HEADER_SIZE",
    "MAX_FRAME_BODY",
    "FrameHeader",
    "encode_frames",
    "parse_frame_header",
    "segment_name",
    "segment_seq",
    "verify_frame",
)

MAGIC: Final = b"WALF"
_FRAME = struct.Struct("<4sIIIQ")
_CHECKED = struct.Struct("<IIQ")  # the header fields the CRC covers
FRAME_HEADER_SIZE: Final = _FRAME.size  # 24
#: Frames are cut at about this many body bytes (a single larger record gets its own frame).
MAX_FRAME_BODY: Final = 1 << 20
SEGMENT_SUFFIX: Final = ".seg"


def segment_name(first_seq: int) -> str:
    """File name of the segment whose first record is ``first_seq``."""
    return f"{first_seq:020d}{SEGMENT_SUFFIX}"


def segment_seq(name: str) -> int | None:
    """The first sequence number of a segment file name, or None if it is not one."""
    stem, dot, suffix = name.partition(".")
    if dot and "." + suffix == SEGMENT_SUFFIX and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


class FrameHeader:
    """A parsed frame header: where the body is and which records it holds."""

    __slots__ = ("body_length", "count", "crc", "first_seq", "offset")

    def __init__(self, offset: int, crc: int, body_length: int, count: int, first_seq: int):
        self.offset = offset
        self.crc = crc
        self.body_length = body_length
        self.count = count
        self.first_seq = first_seq

    @property
    def body_offset(self) -> int:
        return self.offset + FRAME_HEADER_SIZE

    @property
    def end(self) -> int:
        """File offset just past the frame."""
        return self.offset + FRAME_HEADER_SIZE + self.body_length

    @property
    def end_seq(self) -> int:
        """Sequence number just past the frame's last record."""
        return self.first_seq + self.count


def parse_frame_header(buf: bytes | memoryview, at: int, file_offset: int) -> FrameHeader:
    """Parse the header at ``buf[at:]`` (which lies at ``file_offset`` in its segment).
    Raises ``CorruptRecord`` if the magic is wrong."""
    magic, crc, body_length, count, first_seq = _FRAME.unpack_from(buf, at)
    if magic != MAGIC:
        raise CorruptRecord(f"no frame at segment offset {file_offset} (bad magic {magic!r})")
    return FrameHeader(file_offset, crc, body_length, count, first_seq)


def verify_frame(header: FrameHeader, body: bytes | memoryview) -> None:
    """Check the frame's CRC over its header fields and body; raise ``CorruptRecord``."""
    checked = _CHECKED.pack(header.body_length, header.count, header.first_seq)
    if crc32c(body, crc32c(checked)) != header.crc or header.count == 0:
        raise CorruptRecord(
            f"frame at segment offset {header.offset} (records from {header.first_seq})"
            " fails its CRC32C check"
        )


def encode_frames(first_seq: int, records: Sequence[bytes]) -> bytes:
    """Frame ``records`` (envelopes), numbered from ``first_seq``, cutting a new frame
    whenever the body would pass ``MAX_FRAME_BODY``."""
    total = sum(map(len, records))
    if total <= MAX_FRAME_BODY:  # the common batch: one frame
        return _frame(first_seq, records, total)
    parts: list[bytes] = []
    start = 0
    size = 0
    seq = first_seq
    for i, record in enumerate(records):
        if size and size + len(record) > MAX_FRAME_BODY:
            parts.append(_frame(seq, records[start:i], size))
            seq += i - start
            start, size = i, 0
        size += len(record)
    parts.append(_frame(seq, records[start:], size))
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _frame(first_seq: int, records: Sequence[bytes], size: int) -> bytes:
    body = b"".join(records)
    checked = _CHECKED.pack(size, len(records), first_seq)
    crc = crc32c(body, crc32c(checked))
    return b"".join((MAGIC, crc.to_bytes(4, "little"), checked, body))
