"""Batch reads: ``spark.read.format("walsvc")``.

Planning (on the driver) takes each pchannel's newest id once, so a read is a snapshot:
messages appended while it runs are not in it. Each input partition is one id range (a
whole pchannel, or a slice of a large one) read by one task on one event loop, yielding
Arrow record batches.

Spark pushes down comparisons on ``vchannel``, ``type`` and ``timetick``; they narrow
what is read (whole records are skipped by their headers), and because Spark then does
not re-check them, rows are also tested exactly: a pushed ``vchannel = 'v1'`` leaves
out broadcast rows, which the ``vchannels`` option (walsvc's own filter) keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.datasource import Filter as SparkFilter

from ._options import SourceOptions
from ._ranges import IdRange, plan_ranges
from ._read import RowTest, read_rows
from ._sync import iterate, run

__all__ = ("RangePartition", "WalBatchReader", "read_partition")


class RangePartition(InputPartition):
    """One input partition: an id range of one pchannel."""

    def __init__(self, owned: IdRange) -> None:
        super().__init__(owned)
        self.owned = owned


class WalBatchReader(DataSourceReader):
    """Reads the options' pchannels as they are when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.row_tests: list[tuple[str, str, Any]] = []  # pushed filters (picklable)

    def pushFilters(self, filters: list[SparkFilter]) -> Iterable[SparkFilter]:
        """Take the comparisons of ``vchannel``, ``type`` and ``timetick`` with literals;
        give back every other filter for Spark to apply."""
        for pushed in filters:
            accepted = _accept(pushed)
            if accepted is None:
                yield pushed
                continue
            self.row_tests.append(accepted)
            self.options = _narrow(self.options, *accepted)

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in run(plan_ranges(self.options))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's placeholder when there are no partitions
        return read_partition(self.options, partition.owned, self.row_tests)


def read_partition(
    options: SourceOptions, owned: IdRange, row_tests: Sequence[tuple[str, str, Any]] = ()
) -> Iterator[Any]:
    """Arrow record batches of the rows ``owned`` owns (see ``_ranges``) that pass the
    pushed-down ``row_tests``."""
    tests = [_row_test(*t) for t in row_tests]
    for rows in iterate(lambda: read_rows(options, owned, tests)):
        yield rows.record_batch(owned.pchannel)


_COMPARISONS: dict[type[SparkFilter], str] = {
    EqualTo: "==",
    In: "in",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}


def _accept(pushed: SparkFilter) -> tuple[str, str, Any] | None:
    """``(column, operator, value)`` for a filter this source applies, else None."""
    operator = _COMPARISONS.get(type(pushed))
    attribute: tuple[str, ...] = getattr(pushed, "attribute", ())
    if operator is None or len(attribute) != 1:
        return None
    column, value = attribute[0], getattr(pushed, "value", None)
    values: tuple[Any, ...] = tuple(value or ()) if operator == "in" else (value,)
    if column == "vchannel" and operator in ("==", "in"):
        ok = all(type(v) is str for v in values)
    elif column == "type" and operator in ("==", "in"):
        ok = all(type(v) is int for v in values)
    elif column == "timetick":
        ok = operator != "in" and type(value) is int
    else:
        ok = False
    return (column, operator, values if operator == "in" else value) if ok else None


def _narrow(options: SourceOptions, column: str, operator: str, value: Any) -> SourceOptions:
    """``options`` with the walsvc filter narrowed by an accepted pushed filter."""
    if column == "vchannel":
        wanted = set(value) if operator == "in" else {value}
        if options.vchannels is not None:
            wanted &= set(options.vchannels)
        return msgspec.structs.replace(options, vchannels=tuple(sorted(wanted)))
    if column == "type":
        wanted_types = set(value) if operator == "in" else {value}
        if options.types is not None:
            wanted_types &= set(options.types)
        return msgspec.structs.replace(options, types=tuple(sorted(wanted_types)))
    floor, ceiling = options.timetick_from, options.timetick_to
    if operator in (">", ">=", "=="):
        floor = max(floor, value + 1 if operator == ">" else value)
    if operator in ("<", "<=", "=="):
        bound = value - 1 if operator == "<" else value
        ceiling = bound if ceiling is None else min(ceiling, bound)
    return msgspec.structs.replace(
        options, timetick_from=max(floor, 0), timetick_to=None if ceiling is None else ceiling
    )


def _row_test(column: str, operator: str, value: Any) -> RowTest:
    """The exact SQL meaning of an accepted pushed filter, on a row's (vchannel, type,
    timetick)."""
    if column == "vchannel":
        names = frozenset(value) if operator == "in" else frozenset((value,))
        return lambda vchannel, type_, tick: vchannel in names
    if column == "type":
        kinds = frozenset(value) if operator == "in" else frozenset((value,))
        return lambda vchannel, type_, tick: type_ in kinds
    tests: dict[str, RowTest] = {
        "==": lambda vchannel, type_, tick: tick == value,
        ">": lambda vchannel, type_, tick: tick > value,
        ">=": lambda vchannel, type_, tick: tick >= value,
        "<": lambda vchannel, type_, tick: tick < value,
        "<=": lambda vchannel, type_, tick: tick <= value,
    }
    return tests[operator]
