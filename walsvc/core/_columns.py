"""Column-wise reading of envelope runs, for readers that build columns (the Spark data
source) rather than messages: the header fields of a run as one list per field, and a
run's payloads as the buffers of one Arrow binary column. The loops are compiled when
walsvc was built with ``walsvc/core/_speedups.c`` (``walsvc.core._compiled``), else run in Python.
"""

from __future__ import annotations

import itertools
import operator
from array import array

from . import _compiled
from ._codec import _CACHE_LIMIT, _HEADER, HEADER_SIZE, VERSION, _types, _unpack_header
from ._errors import CorruptRecord

__all__ = ("HeaderColumns", "decode_columns", "gather_payloads", "walk_columns")


class HeaderColumns:
    """The header fields of a run of envelopes, one list per field (index i: the i-th
    envelope of the run): what a column-wise reader needs without building messages.
    ``exts`` holds each ext section as bytes (``b""``: none; see ``ext_fields``), equal
    ones of consecutive envelopes as one object;
    the payload of envelope i is ``data[payload_starts[i]:ends[i]]``."""

    __slots__ = ("ends", "exts", "payload_starts", "terms", "timeticks", "types", "vchannels")

    def __init__(self) -> None:
        self.types: list[int] = []
        self.vchannels: list[str] = []
        self.timeticks: list[int] = []
        self.terms: list[int] = []
        self.exts: list[bytes] = []
        self.payload_starts: list[int] = []
        self.ends: list[int] = []

    def fields(
        self,
    ) -> tuple[list[int], list[str], list[int], list[int], list[bytes], list[int], list[int]]:
        """The seven lists in header order: types, vchannels, timeticks, terms, exts,
        payload_starts, ends."""
        return (
            self.types,
            self.vchannels,
            self.timeticks,
            self.terms,
            self.exts,
            self.payload_starts,
            self.ends,
        )


def decode_columns(
    data: bytes | memoryview, start: int = 0, end: int | None = None
) -> HeaderColumns:
    """Decode the headers of the envelopes laid end to end in ``data[start:end]`` column by
    column, with the checks of ``decode_run``; payloads are not touched. Raises
    ``CorruptRecord`` if the run is not a whole number of valid envelopes.

    Runs the compiled walk (``walsvc/core/_speedups.c``) when walsvc was built with it, else
    ``walk_columns``: the same loop in Python, about ten times slower."""
    if end is None:
        end = len(data)
    columns = HeaderColumns()
    if len(_column_names) >= _CACHE_LIMIT:
        _column_names.clear()
    if _compiled.decode_columns_into is None:
        walk_columns(data, start, end, columns)
    else:
        _compiled.decode_columns_into(
            data,
            start,
            end,
            *columns.fields(),
            _types,
            _column_names,
            _unpack_header,
            CorruptRecord,
        )
    return columns


#: decode_columns's vchannels checked in full: header hash -> (UTF-8 name, name).
_column_names: dict[int, tuple[bytes, str]] = {}


def walk_columns(data: bytes | memoryview, start: int, end: int, columns: HeaderColumns) -> None:
    """``decode_columns``'s loop in Python: append the headers of ``data[start:end]`` to
    ``columns``. The compiled walk must do exactly this (tests/test_codec_columns.py holds them
    to it)."""
    types, vchannels, ticks, terms, exts, payload_starts, ends = columns.fields()
    unpack = _HEADER.unpack_from
    known_types = _types
    names = _column_names  # vchannel hash -> (UTF-8 name, name), checked in full once
    last_ext = b""
    offset = start
    while offset < end:
        if end - offset < HEADER_SIZE:
            raise CorruptRecord(f"run ends inside a record header at byte {offset}")
        version, flags, type_no, total, vc_hash, vc_len, reserved, tick, term, ext_len = unpack(
            data, offset
        )
        record_end = offset + total
        ext_start = offset + HEADER_SIZE + vc_len
        payload_start = ext_start + ext_len
        if (
            version != VERSION
            or flags
            or reserved
            or total < HEADER_SIZE
            or record_end > end
            or payload_start > record_end
            or type_no not in known_types
        ):
            _unpack_header(data, offset, end)  # raises CorruptRecord naming the fault
        vc = data[offset + HEADER_SIZE : ext_start]
        seen = names.get(vc_hash)
        if seen is None or seen[0] != vc:
            # A log repeats a few vchannels: each is checked in full once.
            seen = (bytes(vc), _unpack_header(data, offset, end)[1])
            names[vc_hash] = seen
        types.append(type_no)
        vchannels.append(seen[1])
        ticks.append(tick)
        terms.append(term)
        if ext_len:
            ext = data[ext_start:payload_start]
            if ext != last_ext:  # runs share one ext (last-confirmed id): one copy each
                last_ext = bytes(ext)
            exts.append(last_ext)
        else:
            exts.append(b"")
        payload_starts.append(payload_start)
        ends.append(record_end)
        offset = record_end


def gather_payloads(
    data: bytes | memoryview, payload_starts: list[int], ends: list[int]
) -> tuple[bytes, bytes]:
    """The payloads ``data[payload_starts[i]:ends[i]]`` of a run (see ``HeaderColumns``) as
    the two buffers of an Arrow binary column: n + 1 int32 offsets (native byte order)
    and the payloads end to end. Compiled when walsvc was built with
    ``walsvc/core/_speedups.c``."""
    if _compiled.gather_payloads is not None:
        return _compiled.gather_payloads(data, payload_starts, ends)
    view = memoryview(data)
    lengths = map(operator.sub, ends, payload_starts)
    offsets = array("i", itertools.accumulate(lengths, initial=0)).tobytes()
    return offsets, b"".join(map(view.__getitem__, map(slice, payload_starts, ends)))
