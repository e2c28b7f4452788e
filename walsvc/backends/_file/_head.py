"""The ``head`` file of a pchannel directory: the current writer term, the end of the
durable records (as a sequence number, and as a segment and byte offset), the first record
not truncated away, and the greatest timetick. It is also the writers' lock: a writer
holds ``flock(LOCK_EX)`` on it while it recovers and while it writes a batch.

Every acknowledged record lies below the durable end, which the writer records after the
batch's ``fdatasync`` and before acknowledging it. That is what lets recovery tell a torn
tail (after the durable end: never acknowledged, cut) from damage to acknowledged records
(before it: never cut), and start at the durable end instead of reading the segment.

Layout, version 2 (60 bytes, little-endian): magic ``WALH``, version, reserved, term,
durable end, first sequence number, last timetick, the segment holding the durable end
and the byte offset of the durable end in it, then the CRC32C of those 56 bytes.
Version 1 (44 bytes) lacked the last two; such a head reads with ``end_segment`` set to
``UNKNOWN`` and is rewritten as version 2 by the next writer.

Fencing follows from that: a read-write open bumps the term under the lock; a writer
re-reads the term under the lock before every batch and stops for good if it changed.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from typing import Final, NamedTuple

from crc32c import crc32c

from walsvc.core._errors import CorruptRecord

__all__ = ("HeadFile", "HeadState")

_MAGIC: Final = b"WALH"
_VERSION: Final = 2
# magic, version, reserved, term, durable end, first seq, last timetick, end segment, offset
_LAYOUT = struct.Struct("<4sHHQQQQQQ")
_SIZE: Final = _LAYOUT.size + 4  # plus CRC32C
_LAYOUT_V1 = struct.Struct("<4sHHQQQQ")
_SIZE_V1: Final = _LAYOUT_V1.size + 4
#: ``HeadState.end_segment`` of a version 1 head: where the durable end lies is unknown.
UNKNOWN: Final = (1 << 64) - 1


_READ_ATTEMPTS: Final = 5
_RETRY_SECONDS: Final = 0.0002


class HeadState(NamedTuple):
    """What the head file says."""

    term: int
    #: Records with a smaller sequence number are durable and complete.
    durable_end: int
    #: Records with a smaller sequence number were truncated away.
    first_seq: int
    #: The greatest timetick appended so far (kept through truncation).
    last_timetick: int
    #: The segment (its first sequence number) holding the durable end, ``UNKNOWN`` if
    #: a version 1 head did not say.
    end_segment: int = UNKNOWN
    #: The byte offset in ``end_segment`` just past the last durable frame.
    end_offset: int = 0


class HeadFile:
    """Read, write and lock a pchannel's head file."""

    __slots__ = ("fd", "path")

    def __init__(self, path: str, *, writable: bool) -> None:
        """Open ``path`` (created if ``writable`` and missing); a read-only open needs
        only read access, so backups and read-only media can be read."""
        self.path = path
        flags = os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
        self.fd = os.open(path, flags | os.O_CLOEXEC, 0o644)

    def empty(self) -> bool:
        """True if the file holds nothing yet (a log being created)."""
        return os.fstat(self.fd).st_size == 0

    def read(self) -> HeadState:
        """The current state; an empty file reads as term 0 with no records (a log being
        created: whether segments exist beside it is the opener's check).

        Readers do not take the lock, and Linux does not make a read atomic against a
        concurrent ``pwrite`` of the same bytes, so a read that fails its checks is retried
        a few times before it counts as corruption.
        """
        for attempt in range(_READ_ATTEMPTS):
            data = os.pread(self.fd, _SIZE + 1, 0)
            if not data:
                return HeadState(0, 0, 0, 0)
            state = _parse(data)
            if state is not None:
                return state
            if attempt:
                time.sleep(_RETRY_SECONDS)
        if len(data) not in (_SIZE, _SIZE_V1):
            raise CorruptRecord(f"{self.path}: head file is {len(data)} bytes, not {_SIZE}")
        raise CorruptRecord(f"{self.path}: head file fails its checks")

    def write(self, state: HeadState, *, sync: bool) -> None:
        """Overwrite the state (one small write at offset 0); ``sync`` makes it durable."""
        body = _LAYOUT.pack(_MAGIC, _VERSION, 0, *state)
        data = body + crc32c(body).to_bytes(4, "little")
        if os.pwrite(self.fd, data, 0) != len(data):
            raise OSError(f"{self.path}: short write of the head file")
        if sync:
            os.fsync(self.fd)

    def try_lock(self) -> bool:
        """Take the writers' lock if it is free; never blocks."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def lock(self) -> None:
        """Take the writers' lock, waiting for it (call from a worker thread)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


def _parse(data: bytes) -> HeadState | None:
    """The state in ``data``, or None if it fails its length, magic, CRC or version."""
    if len(data) == _SIZE_V1:
        layout, expected = _LAYOUT_V1, 1
    elif len(data) == _SIZE:
        layout, expected = _LAYOUT, _VERSION
    else:
        return None
    magic, version, _, *fields = layout.unpack_from(data)
    if magic != _MAGIC or version != expected:
        return None
    if int.from_bytes(data[-4:], "little") != crc32c(data[:-4]):
        return None
    return HeadState(*fields)
