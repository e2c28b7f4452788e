"""Reading one id range into rows, column by column (see ``_ranges`` for what a range
owns and ``_rows`` for what becomes a row).

Two engines give the same rows:

- **Runs** (backends that store envelopes end to end: ``file://``): headers are decoded
  column-wise straight from the stored bytes and payloads are sliced, never copied into
  messages. Plain data records (no transaction, in order) go to the columns directly;
  every other record (transaction control and bodies, TimeTicks, a record out of order)
  is decoded into a message and goes through the same stages as below, in log order.
- **Messages** (every backend): a raw ``WAL.read`` scan through the stages ``WAL.read``
  applies (filter, reorder, transactions), then the range's bounds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from scanners._reorder import ReorderBuffer
from scanners._txn_buffer import TxnBuffer
from walsvc.backends._base import RunScanner
from walsvc.core._codec import decode, ext_fields
from walsvc.core._columns import HeaderColumns, decode_columns
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import WALTruncated
from walsvc.core._ids import MessageId, SequenceMessageId
from walsvc.core._message import SYSTEM_TYPES, ImmutableMessage, MessageType, TxnContext
from walsvc.wal._wal import LocalWAL as WAL

from ._options import SourceOptions
from ._ranges import IdRange, open_reader, raw_up_to, replay_start, unless_stalled
from ._rows import RowColumns, data_rows

__all__ = ("RowTest", "read_rows")

#: A pushed-down filter as a test of a row's (vchannel, type, timetick).
RowTest = Callable[[str, int, int], bool]

_TIME_TICK = int(MessageType.TIME_TICK)
_SPECIAL = frozenset(int(t) for t in SYSTEM_TYPES) - {_TIME_TICK}


async def read_rows(
    options: SourceOptions, owned: IdRange, tests: Sequence[RowTest] = ()
) -> AsyncIterator[RowColumns]:
    """The rows of ``owned`` that pass ``tests``, in delivery order, in chunks of about
    ``options.rows_per_batch`` rows. Raises ``RangeStalled`` if the log stops short of the
    range's end."""
    after, end = owned.bounds()
    async with await open_reader(options, owned.pchannel) as wal:
        start = await replay_start(wal, options, after, end)
        if start is None:
            return
        stages = _Stages(options, after, tests)
        backend = wal.backend
        runs = backend.read_runs(start) if isinstance(end, SequenceMessageId) else None
        if runs is not None:
            assert isinstance(end, SequenceMessageId)
            rows = _rows_from_runs(wal, runs, stages, end, options)
        else:
            rows = _rows_from_messages(wal, start, stages, end, options)
        async for chunk in rows:
            yield chunk


class _Stages:
    """What lies between stored messages and a range's rows: ``WAL.read``'s filter,
    reorder and transaction stages, then the range's start and timetick bounds and the
    pushed-down row tests."""

    __slots__ = ("after", "ceiling", "filter", "finished", "floor", "reorder", "tests", "txns")

    def __init__(
        self, options: SourceOptions, after: MessageId | None, tests: Sequence[RowTest]
    ) -> None:
        selected = options.source_filter()
        self.filter = None if selected.is_everything else selected
        self.reorder = ReorderBuffer(ordered=True)
        self.txns = TxnBuffer(max_bytes=options.txn_buffer_bytes)
        self.after = after
        self.floor, self.ceiling = options.timetick_from, options.timetick_to
        self.tests = tuple(tests)
        self.finished = False  # a delivered message passed the ceiling: nothing more

    def push(self, stored: Sequence[ImmutableMessage], rows: RowColumns) -> None:
        """Run stored messages (log order) through the stages into ``rows``."""
        selected = self.filter
        batch = stored if selected is None else [m for m in stored if selected.admits(m)]
        if not batch:
            return
        delivered = self.reorder.push(batch)
        if delivered:
            delivered = self.txns.push(delivered)
        after, floor, ceiling, tests = self.after, self.floor, self.ceiling, self.tests
        for message in delivered:
            if ceiling is not None and message.timetick > ceiling:
                self.finished = True
                return
            if (after is not None and message.message_id <= after) or message.timetick < floor:
                continue
            for row in data_rows((message,)):
                if all(test(row.vchannel, row.type, row.timetick) for test in tests):
                    rows.add(row)


async def _rows_from_messages(
    wal: WAL, start: DeliverPolicy, stages: _Stages, end: MessageId, options: SourceOptions
) -> AsyncIterator[RowColumns]:
    rows = RowColumns()
    async for stored, done in raw_up_to(wal, start, end, options.stall_timeout):
        stages.push(stored, rows)
        if len(rows) >= options.rows_per_batch or rows.full:
            yield rows
            rows = RowColumns()
        if done or stages.finished:
            break
    if rows:
        yield rows


async def _rows_from_runs(
    wal: WAL, scanner: RunScanner, stages: _Stages, end: SequenceMessageId, options: SourceOptions
) -> AsyncIterator[RowColumns]:
    """The runs engine (see the module docstring)."""
    make_id = type(end)
    prefix = f"{make_id.scheme}:"
    end_seq = end.seq
    after = stages.after
    after_seq = after.seq if isinstance(after, SequenceMessageId) else -1
    selected, reorder, tests = stages.filter, stages.reorder, stages.tests
    admit = reorder.admit
    floor, ceiling = stages.floor, stages.ceiling
    plain_runs = selected is None and not tests  # whole runs may skip the per-record loop
    rows = RowColumns()
    started = False
    try:
        while True:
            try:
                runs = await unless_stalled(scanner.next_runs(), wal, end, options.stall_timeout)
            except WALTruncated:
                if started:
                    raise
                # The replay start is gone: start at the first retained record, as a
                # raw scan does (transactions begun before it cannot be assembled).
                await scanner.aclose()
                reopened = wal.backend.read_runs(DeliverPolicy.all())
                assert reopened is not None
                scanner = reopened
                started = True
                continue
            started = True
            for first_seq, data, run_start in runs:
                columns = decode_columns(data, run_start)
                if plain_runs and _take_plain_run(
                    columns, data, first_seq, rows, stages, prefix, make_id, after_seq, end_seq
                ):
                    seq = first_seq + len(columns.types) - 1
                    if seq >= end_seq:
                        yield rows
                        return
                    if len(rows) >= options.rows_per_batch or rows.full:
                        yield rows
                        rows = RowColumns()
                    continue
                ids, ticks_out, vchannels_out = rows.ids, rows.ticks, rows.vchannels
                types_out, payloads, properties_out = rows.types, rows.payloads, rows.properties
                txn_ids = rows.txn_ids
                offset = run_start
                seq = first_seq - 1
                last_ext: bytes | None = None
                properties: Mapping[str, str] = {}
                txn: TxnContext | None = None
                for type_no, vchannel, tick, term, ext, payload_start, record_end in zip(
                    *columns.fields(), strict=True
                ):
                    seq += 1
                    record_start, offset = offset, record_end
                    if seq > end_seq:
                        break
                    if selected is not None and not selected.admits_fields(vchannel, type_no, tick):
                        continue
                    if ext is not last_ext:  # consecutive equal exts are one object
                        properties, txn = ext_fields(ext, make_id)
                        last_ext = ext
                    if type_no in _SPECIAL or txn is not None or not admit(tick, term):
                        # Transaction control and bodies go through the transaction
                        # stage; a record out of order is rejected by the reorder stage.
                        stages.push([decode(data[record_start:record_end], make_id(seq))], rows)
                    elif ceiling is not None and tick > ceiling:
                        stages.finished = True
                    elif type_no != _TIME_TICK and seq > after_seq and tick >= floor:
                        if tests and not all(t(vchannel, type_no, tick) for t in tests):
                            continue
                        ids.append(f"{prefix}{seq}")
                        ticks_out.append(tick)
                        vchannels_out.append(vchannel)
                        types_out.append(type_no)
                        properties_out.append(properties)
                        payloads.append(data[payload_start:record_end])
                        txn_ids.append(None)
                        rows.payload_bytes += record_end - payload_start
                    if stages.finished:
                        break
                if seq >= end_seq or stages.finished:
                    if rows:
                        yield rows
                    return
                if len(rows) >= options.rows_per_batch or rows.full:
                    yield rows
                    rows = RowColumns()
    finally:
        await scanner.aclose()


def _take_plain_run(
    columns: HeaderColumns,
    data: memoryview,
    first_seq: int,
    rows: RowColumns,
    stages: _Stages,
    prefix: str,
    id_class: type[MessageId],
    after_seq: int,
    end_seq: int,
) -> bool:
    """Add a whole run to ``rows`` at once if every record of it becomes a row as it is:
    data messages only (no TimeTick, no transaction), one ext section, in timetick
    order from one writer term, inside the range's ids and timetick bounds. False (and
    nothing changed) otherwise: the caller then goes record by record."""
    types, ticks, terms, exts = columns.types, columns.timeticks, columns.terms, columns.exts
    count = len(types)
    if (
        not count
        or first_seq <= after_seq
        or first_seq + count - 1 > end_seq
        or _TIME_TICK in types
        or not _SPECIAL.isdisjoint(types)
        or exts.count(exts[0]) != count
        or terms.count(terms[0]) != count
        or ticks[0] < stages.floor
        or (stages.ceiling is not None and ticks[-1] > stages.ceiling)
        or ticks != sorted(ticks)
        or len(set(ticks)) != count
    ):
        return False
    properties, txn = ext_fields(exts[0], id_class)
    if txn is not None or not stages.reorder.admit(ticks[0], terms[0]):
        return False
    stages.reorder.admit(ticks[-1], terms[-1])  # ticks increase: the rest pass too
    rows.add_run(prefix, first_seq, columns, data, properties)
    return True
