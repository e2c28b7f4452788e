"""The rows the data source yields: their Spark schema, the matching Arrow schema, and
how delivered messages become rows and Arrow record batches, built column by column.

One row per data message a reader gets from ``WAL.read``: TimeTicks (persisted or
idle) carry no data and yield no row, and a committed transaction (one ``TXN`` message)
yields one row per body message, with the commit's timetick and the transaction id.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from walsvc.core import _compiled
from walsvc.core._columns import HeaderColumns, gather_payloads
from walsvc.core._message import ImmutableMessage, MessageType

__all__ = ("COLUMNS", "MAX_BATCH_BYTES", "SCHEMA", "RowColumns", "arrow_schema", "data_rows")

#: The Spark schema of every row the data source reads (and of what it writes back).
SCHEMA: Final = StructType(
    [
        StructField("pchannel", StringType(), nullable=False),
        StructField("message_id", StringType(), nullable=False),
        StructField("timetick", LongType(), nullable=False),
        StructField("vchannel", StringType(), nullable=False),
        StructField("type", IntegerType(), nullable=False),
        StructField("properties", MapType(StringType(), StringType()), nullable=False),
        StructField("payload", BinaryType(), nullable=False),
        StructField("txn_id", LongType(), nullable=True),
    ]
)
#: Column names, in schema order.
COLUMNS: Final = tuple(field.name for field in SCHEMA.fields)
#: Runs of at least this many rows become Arrow arrays at once (RowColumns.add_run):
#: below it the fixed cost of building seven arrays outweighs the per-row saving.
ARRAY_RUN: Final = 512
#: An Arrow batch is cut before its payloads pass this many bytes (32-bit offsets).
MAX_BATCH_BYTES: Final = 256 << 20

_NO_DATA: Final = frozenset({MessageType.TIME_TICK})


def arrow_schema() -> Any:
    """The Arrow schema of the record batches ``record_batches`` builds (matches
    ``SCHEMA`` exactly, which Spark checks)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("pchannel", pa.string(), nullable=False),
            pa.field("message_id", pa.string(), nullable=False),
            pa.field("timetick", pa.int64(), nullable=False),
            pa.field("vchannel", pa.string(), nullable=False),
            pa.field("type", pa.int32(), nullable=False),
            pa.field(
                "properties",
                pa.map_(pa.string(), pa.string()),
                nullable=False,
            ),
            pa.field("payload", pa.binary(), nullable=False),
            pa.field("txn_id", pa.int64(), nullable=True),
        ]
    )


def data_rows(delivered: Iterable[ImmutableMessage]) -> Iterator[ImmutableMessage]:
    """The messages that become rows, in delivery order: TXN messages are replaced by
    their bodies; TimeTicks are left out."""
    for message in delivered:
        kind = message.type
        if kind is MessageType.TXN:
            yield from message.body
        elif kind not in _NO_DATA:
            yield message


class RowColumns:
    """Rows under construction: rows added one at a time go to one list per column; whole
    runs (``add_run``) arrive as Arrow arrays, built without a Python object per row. The
    pchannel column is the same for every row of a range and is added when the batch is
    built. ``payloads`` may hold memoryviews into stored blocks: build the batch before
    the next read."""

    __slots__ = (
        "_chunk_rows",
        "_chunks",
        "ids",
        "payload_bytes",
        "payloads",
        "properties",
        "ticks",
        "txn_ids",
        "types",
        "vchannels",
    )

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.ticks: list[int] = []
        self.vchannels: list[str] = []
        self.types: list[int] = []
        self.properties: list[Mapping[str, str]] = []
        self.payloads: list[bytes | memoryview] = []
        self.txn_ids: list[int | None] = []
        self.payload_bytes = 0
        # Earlier rows as Arrow arrays (every column but pchannel), in row order.
        self._chunks: list[list[Any]] = []
        self._chunk_rows = 0

    def __len__(self) -> int:
        return self._chunk_rows + len(self.ids)

    @property
    def full(self) -> bool:
        """True once the payloads reach ``MAX_BATCH_BYTES``."""
        return self.payload_bytes >= MAX_BATCH_BYTES

    def add(self, row: ImmutableMessage) -> None:
        """Append the row of a data message (see ``data_rows``)."""
        self.ids.append(row.message_id.marshal())
        self.ticks.append(row.timetick)
        self.vchannels.append(row.vchannel)
        self.types.append(row.type)
        self.properties.append(row.properties)
        self.payloads.append(row.payload)
        self.txn_ids.append(None if row.txn is None else row.txn.txn_id)
        self.payload_bytes += len(row.payload)

    def add_run(
        self,
        id_prefix: str,
        first_seq: int,
        columns: HeaderColumns,
        data: bytes | memoryview,
        properties: Mapping[str, str],
    ) -> None:
        """Append one row per envelope of a run decoded by ``decode_columns`` (records
        numbered from ``first_seq``, ids ``f"{id_prefix}{seq}"``, every one a data message
        with ``properties`` and no transaction): a run of ``ARRAY_RUN`` rows or more as
        Arrow arrays, a shorter one (a group-commit frame of a few producers) to the
        lists, where building seven arrays would cost more than its rows."""
        import pyarrow as pa

        count = len(columns.types)
        if count < ARRAY_RUN:
            ids = [f"{id_prefix}{seq}" for seq in range(first_seq, first_seq + count)]
            self._extend_lists(ids, columns, data, properties)
            return
        self._seal_lists()
        offsets, values = gather_payloads(data, columns.payload_starts, columns.ends)
        self._chunks.append(
            [
                _numbered_strings(id_prefix, first_seq, count),
                pa.array(columns.timeticks, pa.int64()),
                pa.array(columns.vchannels, pa.string()),
                pa.array(columns.types, pa.int32()),
                _properties_column([properties] * count, count),
                pa.Array.from_buffers(
                    pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
                ),
                pa.nulls(count, pa.int64()),
            ]
        )
        self._chunk_rows += count
        self.payload_bytes += len(values)

    def _extend_lists(
        self,
        ids: list[str],
        columns: HeaderColumns,
        data: bytes | memoryview,
        properties: Mapping[str, str],
    ) -> None:
        """``add_run`` for a short run: its rows (with these ``ids``) onto the lists."""
        count = len(ids)
        self.ids += ids
        self.ticks += columns.timeticks
        self.vchannels += columns.vchannels
        self.types += columns.types
        self.properties += [properties] * count
        starts, ends = columns.payload_starts, columns.ends
        self.payloads += map(data.__getitem__, map(slice, starts, ends))
        self.txn_ids += [None] * count
        self.payload_bytes += sum(ends) - sum(starts)

    def _seal_lists(self) -> None:
        """Move the rows held in lists to a chunk of Arrow arrays (the lists are emptied
        in place: callers may hold them)."""
        if self.ids:
            self._chunks.append(self._list_arrays())
            self._chunk_rows += len(self.ids)
            for column in (
                self.ids,
                self.ticks,
                self.vchannels,
                self.types,
                self.properties,
                self.payloads,
                self.txn_ids,
            ):
                column.clear()

    def _list_arrays(self) -> list[Any]:
        """The rows held in lists as Arrow arrays, in schema order without pchannel."""
        import pyarrow as pa

        n = len(self.ids)
        payloads = self.payloads
        payload = pa.Array.from_buffers(
            pa.binary(),
            n,
            [
                None,
                pa.py_buffer(array("i", itertools.accumulate(map(len, payloads), initial=0))),
                pa.py_buffer(b"".join(payloads)),
            ],
        )
        return [
            pa.array(self.ids, pa.string()),
            pa.array(self.ticks, pa.int64()),
            pa.array(self.vchannels, pa.string()),
            pa.array(self.types, pa.int32()),
            _properties_column(self.properties, n),
            payload,
            pa.array(self.txn_ids, pa.int64()),
        ]

    def record_batch(self, pchannel: str) -> Any:
        """The rows as one Arrow record batch of ``arrow_schema()``."""
        import pyarrow as pa

        self._seal_lists()
        chunks = self._chunks or [self._list_arrays()]
        if len(chunks) == 1:
            columns = chunks[0]
        else:
            columns = [pa.concat_arrays(list(parts)) for parts in zip(*chunks, strict=True)]
        n = len(columns[0])
        first_row = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(bytes(4 * n))])
        pchannels = pa.array([pchannel], pa.string()).take(first_row)
        return pa.RecordBatch.from_arrays([pchannels, *columns], schema=arrow_schema())


def _numbered_strings(prefix: str, first: int, count: int) -> Any:
    """The string column ``f"{prefix}{first + i}"`` for i in range(count): a run's ids."""
    import pyarrow as pa

    if _compiled.numbered_strings is None:
        return pa.array([f"{prefix}{seq}" for seq in range(first, first + count)], pa.string())
    offsets, values = _compiled.numbered_strings(prefix.encode(), first, count)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )


def _properties_column(maps: list[Mapping[str, str]], n: int) -> Any:
    """The map column of ``n`` rows' properties."""
    import pyarrow as pa

    if not any(maps):
        return _empty_maps(n)
    return pa.MapArray.from_arrays(
        pa.array(array("i", itertools.accumulate(map(len, maps), initial=0)), pa.int32()),
        pa.array([k for p in maps for k in p], pa.string()),
        pa.array([v for p in maps for v in p.values()], pa.string()),
    )


def _empty_maps(n: int) -> Any:
    """A map column of ``n`` empty maps."""
    import pyarrow as pa

    return pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))]),
        pa.array([], pa.string()),
        pa.array([], pa.string()),
    )
