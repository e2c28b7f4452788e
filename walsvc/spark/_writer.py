"""Writes: ``df.write.format("walsvc")`` and ``df.writeStream.format("walsvc")``.

Every row becomes one message appended to the option ``pchannel`` through the WAL's
default interceptor chain (timeticks, dedup, exclusive DDL, transactions, redo), so
timeticks increase in log order and DDL rows serialize as ``WAL.append`` makes them.

Input columns (names case-insensitive, any order):

- ``vchannel`` string and ``payload`` binary: required, never null;
- ``type`` (any integer type; null or absent: ``INSERT``) and ``properties``
  (``map<string,string>``; null or absent: none): optional;
- ``pchannel``, ``message_id``, ``timetick``, ``txn_id``: ignored, so a DataFrame read
  from one WAL can be written to another (transaction bodies become plain messages).

Anything else is refused on the driver before a task runs (``walsvc.InvalidArgument``),
and so are mode ``overwrite`` and output mode ``complete`` (a WAL is append-only; Spark
itself refuses the modes ``error``, ``ignore`` and output mode ``update``), a
``memory://`` URL (each Spark process would get a log of its own) and an unknown scheme
(``walsvc.UnknownBackend``).

**Exactly once.** Each row carries an idempotency key made of the write id, the
partition id and the row's index within its partition (and, for a stream, the
micro-batch id). A batch write's id is a fresh uuid4 made on the driver, unless the
option ``writeId`` names it; a stream's id is its query id (the same after a restart from
the same checkpoint), unless ``writeId`` names it. A retried task (or a re-run micro-batch)
re-appends its rows with the keys of the first attempt, and the dedup interceptor,
whose window is rebuilt from the log on open, answers the rows already there instead of
appending them again. This holds when:

- a retry sees the partition's rows in the same order (true of file sources and of plans
  without a shuffle; after a shuffle, ``sortWithinPartitions`` makes it so);
- the dedup window covers them: each task's window holds the newest ``dedupMaxKeys``
  keyed messages of the pchannel (default 100 000) no older than ``dedupMaxAge`` seconds
  (default 600, measured in timeticks). A task that appends more rows than that, or a
  retry that comes later than that, re-appends the rows that fell out of the window.
  Tasks writing one pchannel at once share the window, so it must cover all their rows.
  A larger window costs memory (a few hundred bytes per key) and a longer rebuild at
  every open. The driver logs a warning when a task wrote more rows than
  ``dedupMaxKeys``;
- the job's failure is not the end: a failed job leaves the rows its tasks appended (a
  WAL cannot take them back). Running it again with the same explicit ``writeId`` within
  the window completes it without duplicates; a generated id makes new keys.

**One writer per pchannel.** Opening a pchannel read-write fences its previous writer,
so tasks writing the same pchannel at once take it from each other. A fenced task
(``WALFenced``) waits until the pchannel has been quiet for a moment (``QUIET``; the
other writer finished or paused; at most ``QUIET_MAX``), reopens it and re-appends the
rows of the append that failed, with the same keys: dedup answers those that landed. A
task whose append ended ambiguously (``AppendOutcomeUnknown``) or found the backend
unavailable reopens after a jittered, growing pause. After ``REOPEN_ATTEMPTS`` failures
in a row (no append succeeding in between) the task fails, and Spark retries it.
Concurrent tasks are correct but take turns, and every reopen rebuilds the dedup
window: one task per pchannel (``df.coalesce(1)``, or one partition per pchannel) is the
fast path.

**Costs.** Every task's open reads the pchannel's last ``dedupMaxAge`` seconds of log to
rebuild the window: on a busy pchannel, lower ``dedupMaxAge`` (it must still exceed the
time from a task's first append to its retry's open). Rows go to the WAL
``appendBatch`` at a time with ``append_many`` (the dedup interceptor answers the keys it
knows and appends the rest as one batch; a DDL row goes alone); each row carries its key
(about 40 bytes) in the log.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

import msgspec
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from interceptors._dedup import Dedup
from interceptors._default import default_chain
from walsvc.backends._registry import backend_class
from walsvc.core._errors import (
    AppendOutcomeUnknown,
    InvalidArgument,
    InvalidMessage,
    WALError,
    WALFenced,
)
from walsvc.core._message import SYSTEM_TYPES, AppendResult, Message, MessageType, producer_key
from walsvc.wal._open import _PCHANNEL, open_wal

from ._options import WriteOptions
from ._sync import run

if TYPE_CHECKING:
    from walsvc.core._ids import MessageId
    from walsvc.wal._api import WAL

__all__ = (
    "IGNORED_COLUMNS",
    "QUIET",
    "QUIET_MAX",
    "REOPEN_ATTEMPTS",
    "InputColumns",
    "WalBatchWriter",
    "WalCommitMessage",
    "WalStreamWriter",
    "WritePlan",
    "input_columns",
    "plan_write",
    "stream_producer",
    "write_partition",
)

#: Columns of the read side's schema that a write ignores (the log assigns them anew).
IGNORED_COLUMNS: Final = frozenset({"pchannel", "message_id", "timetick", "txn_id"})
#: Reopens in a row (without an append succeeding in between) before a task gives up.
REOPEN_ATTEMPTS: Final = 10
#: The first pause before a reopen, in seconds; it doubles per failed reopen in a row.
REOPEN_BACKOFF: Final = 0.05
#: The longest pause before a reopen, in seconds.
REOPEN_BACKOFF_MAX: Final = 5.0
#: A fenced task takes the pchannel back once nothing was appended for QUIET to 2 x QUIET
#: seconds (jittered), or after QUIET_MAX seconds.
QUIET: Final = 0.1
QUIET_MAX: Final = 30.0

#: Spark's local properties of a streaming micro-batch's tasks (checked on 4.3.0:
#: Python tasks see them through ``TaskContext.getLocalProperty``).
_BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
_QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
_WRITE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,100}")
_INTEGERS: Final = (ByteType, ShortType, IntegerType, LongType)
_REQUIRED: Final = ("vchannel", "payload")
_EXPECTED: Final = {
    "vchannel": "string",
    "payload": "binary",
    "type": "an integer type",
    "properties": "map<string,string>",
}

_log = logging.getLogger("walsvc.spark")


class InputColumns(msgspec.Struct, frozen=True):
    """Where each input column sits in the rows Spark hands a task (None: absent)."""

    vchannel: int
    payload: int
    type: int | None = None
    properties: int | None = None


class WritePlan(msgspec.Struct, frozen=True):
    """What every task of a write needs, made once on the driver: the options, the write
    id (None for a stream without ``writeId``: its query id is used), whether it is a
    stream, and the input columns."""

    options: WriteOptions
    write_id: str | None
    streaming: bool
    columns: InputColumns


@dataclass(frozen=True)
class WalCommitMessage(WriterCommitMessage):
    """What one task wrote: ``rows`` it handled, of which ``deduplicated`` were in the
    log already and answered by dedup (an earlier attempt's, or this attempt's before a
    reopen); how often it had to ``reopen`` the WAL; the lowest and highest message id
    of its rows (marshalled; None for an empty partition)."""

    pchannel: str
    partition: int
    attempt: int
    rows: int
    deduplicated: int
    reopens: int
    first_id: str | None
    last_id: str | None


def plan_write(
    options: WriteOptions, schema: StructType, *, overwrite: bool, streaming: bool
) -> WritePlan:
    """Check a write on the driver and plan it; raise ``InvalidArgument`` for an
    overwrite, a ``memory://`` URL, a bad pchannel or write id, or input columns that do
    not fit, and ``UnknownBackend`` for a URL whose backend is unknown or not installed."""
    if overwrite:
        raise InvalidArgument(
            "a WAL is append-only: write with mode 'append' (batch) or output mode"
            " 'append' (streaming), not mode 'overwrite' or output mode 'complete'"
        )
    _check_target(options)
    if options.write_id is not None and not _WRITE_ID.fullmatch(options.write_id):
        raise InvalidArgument(
            f"option 'writeId' {options.write_id!r} must be 1-100 characters of [A-Za-z0-9._-]"
        )
    write_id = options.write_id
    if write_id is None and not streaming:
        write_id = uuid.uuid4().hex
    return WritePlan(options, write_id, streaming, input_columns(schema))


def input_columns(schema: StructType) -> InputColumns:
    """Where the input columns are in ``schema``; ``InvalidArgument`` naming every
    problem if a required one is missing, one has the wrong type, or one is unknown."""
    found: dict[str, int] = {}
    seen: set[str] = set()
    problems: list[str] = []
    for index, field in enumerate(schema.fields):
        name = field.name.lower()
        if name in IGNORED_COLUMNS:
            continue
        if name not in _EXPECTED:
            problems.append(f"unknown column {field.name!r}")
        elif name in seen:
            problems.append(f"column {name!r} appears twice")
        elif not _fits(name, field.dataType):
            hint = " (cast it: col('payload').cast('binary'))" if name == "payload" else ""
            problems.append(
                f"column {field.name!r} is {field.dataType.simpleString()},"
                f" expected {_EXPECTED[name]}{hint}"
            )
        else:
            found[name] = index
        seen.add(name)
    problems += (f"required column {n!r} is missing" for n in _REQUIRED if n not in seen)
    if problems:
        raise InvalidArgument(
            "cannot write these rows to a WAL: "
            + "; ".join(problems)
            + ". Columns: vchannel string, payload binary (required), type int, properties"
            " map<string,string> (optional); pchannel, message_id, timetick, txn_id are"
            " ignored"
        )
    return InputColumns(
        vchannel=found["vchannel"],
        payload=found["payload"],
        type=found.get("type"),
        properties=found.get("properties"),
    )


def stream_producer(write_id: str, batch_id: str, partition: int) -> str:
    """The producer id of a stream's task: a micro-batch re-run after a restart (same
    query id, same batch id) gets the keys of its first run."""
    return f"{write_id}/{batch_id}/{partition}"


def write_partition(plan: WritePlan, batches: Iterator[Any]) -> WalCommitMessage:
    """Append the rows of the current Spark task's partition (Arrow record batches) on
    one event loop, exactly once (see the module docs); return what was written."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("write_partition runs in a Spark task")
    partition = context.partitionId()
    write_id = plan.write_id
    if plan.streaming:
        batch_id = context.getLocalProperty(_BATCH_ID_PROPERTY)
        write_id = write_id or context.getLocalProperty(_QUERY_ID_PROPERTY)
        if batch_id is None or write_id is None:
            raise RuntimeError(
                f"the task of a streaming write has no {_BATCH_ID_PROPERTY!r} or"
                f" {_QUERY_ID_PROPERTY!r} local property: cannot derive idempotency keys"
            )
        producer = stream_producer(write_id, batch_id, partition)
    else:
        assert write_id is not None
        producer = f"{write_id}/{partition}"
    return run(_write(plan, producer, batches, partition, context.attemptNumber()))


async def _write(
    plan: WritePlan, producer: str, batches: Iterator[Any], partition: int, attempt: int
) -> WalCommitMessage:
    appender = _Appender(plan.options)
    size = plan.options.append_batch
    rows = deduplicated = 0
    low: MessageId | None = None
    high: MessageId | None = None
    try:
        # Pulling a batch blocks the loop while Spark produces it; nothing in flight
        # needs the loop meanwhile (each chunk is acknowledged before the next pull).
        for batch in batches:
            for start in range(0, batch.num_rows, size):
                messages = _messages(batch.slice(start, size), plan.columns, producer, rows)
                results, answered = await appender.append(messages)
                rows += len(messages)
                deduplicated += answered
                ids = [r.message_id for r in results]
                low = min(ids) if low is None else min(low, *ids)
                high = max(ids) if high is None else max(high, *ids)
    finally:
        await appender.aclose()
    return WalCommitMessage(
        pchannel=plan.options.pchannel,
        partition=partition,
        attempt=attempt,
        rows=rows,
        deduplicated=deduplicated,
        reopens=appender.reopens,
        first_id=None if low is None else low.marshal(),
        last_id=None if high is None else high.marshal(),
    )


def _messages(batch: Any, columns: InputColumns, producer: str, first: int) -> list[Message]:
    """The rows of an Arrow record batch as keyed messages; ``InvalidMessage`` (before
    anything of the batch is appended) for a null vchannel or payload, a bad type, or a
    type the WAL writes itself."""
    n = batch.num_rows
    vchannels = _required(batch, columns.vchannel, "vchannel", first)
    payloads = _required(batch, columns.payload, "payload", first)
    kinds: list[Any] = [None] * n
    if columns.type is not None:
        kinds = batch.column(columns.type).to_pylist()
    properties: list[Any] = [None] * n
    if columns.properties is not None:
        properties = batch.column(columns.properties).to_pylist()
    messages: list[Message] = []
    for i in range(n):
        pairs = properties[i]
        messages.append(
            Message(
                payload=payloads[i],
                vchannel=vchannels[i],
                type=_message_type(kinds[i], first + i),
                properties=dict(pairs) if pairs else {},
                idempotency_key=producer_key(producer, first + i),
            )
        )
    return messages


def _message_type(value: int | None, row: int) -> MessageType:
    """The type of a row: null is INSERT; a type the WAL writes itself, or a number that
    is no type, is an ``InvalidMessage``."""
    if value is None:
        return MessageType.INSERT
    try:
        kind = MessageType(value)
    except ValueError:
        raise InvalidMessage(
            f"row {row} of the partition has type {value}, which is neither a"
            " walsvc.MessageType nor in the application range 10000-65535"
        ) from None
    if kind in SYSTEM_TYPES:
        raise InvalidMessage(
            f"row {row} of the partition has type {kind.name}, which only the WAL writes"
        )
    return kind


def _required(batch: Any, index: int, name: str, first: int) -> list[Any]:
    column = batch.column(index)
    if column.null_count:
        row = first + column.is_null().to_pylist().index(True)
        raise InvalidMessage(f"row {row} of the partition has a null {name}")
    values: list[Any] = column.to_pylist()
    return values


@final
class _Appender:
    """One task's writer of one pchannel: opens the WAL, and reopens it when a newer
    writer fenced it or an append's outcome is unknown, re-appending the same keyed
    messages (dedup answers those that landed)."""

    __slots__ = ("_options", "_rng", "_since", "_wal", "reopens")

    def __init__(self, options: WriteOptions, rng: random.Random | None = None) -> None:
        self._options = options
        self._rng = rng if rng is not None else random.Random()
        self._wal: WAL | None = None
        self._since: MessageId | None = None  # the newest id when this writer opened
        self.reopens = 0

    async def append(self, messages: Sequence[Message]) -> tuple[list[AppendResult], int]:
        """Append ``messages`` (exactly once, by their keys); return their results and
        how many of them were already in the log before the current open."""
        failures = 0
        while True:
            try:
                wal = self._wal or await self._open()
                results = await wal.append_many(messages)
            except (WALFenced, AppendOutcomeUnknown) as exc:
                error: WALError = exc
            except WALError as exc:
                if not exc.retriable:
                    raise
                error = exc
            else:
                since = self._since
                answered = 0 if since is None else sum(r.message_id <= since for r in results)
                return results, answered
            failures += 1
            await self.aclose()
            if failures >= REOPEN_ATTEMPTS:
                hint = (
                    "other writers keep taking the pchannel: write it from one task at a"
                    " time (df.coalesce(1))"
                    if isinstance(error, WALFenced)
                    else "the backend keeps failing"
                )
                raise type(error)(
                    f"pchannel {self._options.pchannel!r}: gave up after {failures} reopens"
                    f" in a row ({error!r}); {hint}"
                ) from error
            ceiling = min(REOPEN_BACKOFF_MAX, REOPEN_BACKOFF * 2 ** (failures - 1))
            await asyncio.sleep(self._rng.uniform(0, ceiling))
            if isinstance(error, WALFenced):
                await self._wait_for_quiet()
            self.reopens += 1

    async def _wait_for_quiet(self) -> None:
        """Another writer took the pchannel: let it finish (no new record for a jittered
        ``QUIET``, at most ``QUIET_MAX`` seconds) before taking it back, so that writers
        hand the pchannel over instead of fencing each other at every append."""
        options = self._options
        loop = asyncio.get_running_loop()
        try:
            reader = await open_wal(
                options.url, options.pchannel, read_only=True, **options.backend_options
            )
        except WALError:
            return
        quiet = self._rng.uniform(QUIET, 2 * QUIET)
        async with reader:
            give_up = loop.time() + QUIET_MAX
            newest = await reader.latest_message_id()
            changed = loop.time()
            while loop.time() - changed < quiet and loop.time() < give_up:
                await asyncio.sleep(quiet / 4)
                now = await reader.latest_message_id()
                if now != newest:
                    newest, changed = now, loop.time()

    async def _open(self) -> WAL:
        options = self._options
        chain = default_chain(
            dedup=Dedup(max_keys=options.dedup_max_keys, max_age=options.dedup_max_age)
        )
        wal = await open_wal(
            options.url, options.pchannel, interceptors=chain, **options.backend_options
        )
        self._wal = wal
        await wal.wait_ready()  # the window is rebuilt; everything before is "since"
        self._since = await wal.latest_message_id()
        return wal

    async def aclose(self) -> None:
        """Close the WAL. Every row was acknowledged before, so a failing close (a
        fenced WAL's last TimeTick) is logged, not raised."""
        wal, self._wal = self._wal, None
        if wal is not None:
            try:
                await wal.aclose()
            except WALError as exc:
                _log.info("closing pchannel %r: %r", self._options.pchannel, exc)


def _check_target(options: WriteOptions) -> None:
    """The URL's backend exists here and is shared between processes; the pchannel name
    is valid."""
    scheme, sep, _ = options.url.partition("://")
    if not sep or not scheme:
        raise InvalidArgument(f"option 'url' {options.url!r} is not a WAL URL (scheme://...)")
    if scheme == "memory":
        raise InvalidArgument(
            "option 'url': a memory:// WAL lives in one process, and Spark tasks run in"
            " other processes; write to file://, kafka:// or pulsar://"
        )
    backend_class(scheme)  # UnknownBackend names the scheme, or the extra to install
    if not _PCHANNEL.fullmatch(options.pchannel):
        raise InvalidArgument(
            f"option 'pchannel' {options.pchannel!r} must be 1-200 characters of"
            " [A-Za-z0-9._-], starting with a letter or digit"
        )


def _fits(name: str, data_type: DataType) -> bool:
    if name == "vchannel":
        return isinstance(data_type, StringType)
    if name == "payload":
        return isinstance(data_type, BinaryType)
    if name == "type":
        return isinstance(data_type, _INTEGERS)
    return (
        isinstance(data_type, MapType)
        and isinstance(data_type.keyType, StringType)
        and isinstance(data_type.valueType, StringType)
    )


def _log_commit(
    plan: WritePlan, outcome: str, messages: Sequence[WriterCommitMessage | None]
) -> None:
    """Log what the tasks wrote; warn about tasks a retry could not have deduplicated."""
    done = [m for m in messages if isinstance(m, WalCommitMessage)]
    _log.info(
        "walsvc write to %r %s: %d task(s), %d rows (%d already in the log), %d reopens",
        plan.options.pchannel,
        outcome,
        len(done),
        sum(m.rows for m in done),
        sum(m.deduplicated for m in done),
        sum(m.reopens for m in done),
    )
    window = plan.options.dedup_max_keys
    if any(m.rows > window for m in done):
        _log.warning(
            "walsvc write to %r: a task wrote %d rows, more than the dedup window"
            " (dedupMaxKeys=%d); had it been retried, its first rows would have been"
            " appended twice: raise dedupMaxKeys or use more, smaller partitions",
            plan.options.pchannel,
            max(m.rows for m in done),
            window,
        )


class WalBatchWriter(DataSourceArrowWriter):
    """``df.write.format("walsvc").mode("append")``: every row appended to the pchannel
    once (see the module docs for the conditions); the constructor (on the driver) refuses
    a write that cannot work."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        self.plan = plan_write(options, schema, overwrite=overwrite, streaming=False)

    def write(self, iterator: Iterator[Any]) -> WalCommitMessage:
        """Append the task's rows; return what was written."""
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what the tasks wrote (their rows are durable already)."""
        _log_commit(self.plan, "committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Log what the finished tasks wrote: a WAL cannot take rows back, so they stay;
        run the write again with the same ``writeId`` to complete it without
        duplicates."""
        _log_commit(self.plan, "aborted (appended rows stay in the log)", messages)


class WalStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("walsvc")``: every row of every micro-batch appended to
    the pchannel once, also when a micro-batch is run again after a restart from its
    checkpoint (see the module docs for the conditions)."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        self.plan = plan_write(options, schema, overwrite=overwrite, streaming=True)

    def write(self, iterator: Iterator[Any]) -> WalCommitMessage:
        """Append the task's rows of this micro-batch; return what was written."""
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the micro-batch wrote (its rows are durable already)."""
        _log_commit(self.plan, f"micro-batch {batchId} committed", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Log what the micro-batch's finished tasks wrote; a re-run of the micro-batch
        appends the rest without duplicating them."""
        outcome = f"micro-batch {batchId} aborted (appended rows stay in the log)"
        _log_commit(self.plan, outcome, messages)
