"""``sqlite://PATH``: a walsvc backend written as an outsider would write one.

Why: issue 22 asks for proof that a third party can write a backend with the public API
alone. This module imports ``walsvc`` and ``walsvc.abc``, nothing private;
``test_outsider_backend.py`` checks that and runs ``walsvc.testing.check_backend`` on it.

What it is: all pchannels of one SQLite file (``sqlite:///abs/path/wal.db`` or
``sqlite://relative/wal.db``), in tables ``logs`` (per pchannel: writer term, first
retained and next sequence number, newest timetick), ``records`` (the envelopes) and
``subscriptions`` (``encode_subscription``'s bytes); WAL journal, ``synchronous=FULL``.

How it works: a backend owns one worker thread and one connection used only there.
``append`` submits its transaction to that thread when called: appends land in call
order, each call in one transaction. The transaction checks the writer's term (each
read-write open bumps it), so a fenced writer's appends raise ``WALFenced``, in any
process. Scanners at the end of the log wait for an in-process append, or poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar, final

import walsvc
from walsvc import DeliverPolicy, Filter, ImmutableMessage
from walsvc.abc import (
    Backend,
    BackendScanner,
    MessageId,
    SequenceMessageId,
    StoredSubscription,
    SubscriptionStore,
    decode_run,
    decode_subscription,
    encode_subscription,
    timetick_of,
)

T = TypeVar("T")
Row = tuple[int, int, int, int]  # a pchannel's (term, first_seq, next_seq, last_tick)
Start = int | asyncio.Future[int] | None  # a scanner's next seq; None: the first retained

BATCH: Final = 256  # records a scanner fetches per query
POLL_SECONDS: Final = 0.05  # how often a scanner at the end looks for other processes
BUSY_SECONDS: Final = 10.0  # how long a transaction waits for another's write lock
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS logs (pchannel TEXT PRIMARY KEY, term INTEGER NOT NULL,
    first_seq INTEGER NOT NULL, next_seq INTEGER NOT NULL, last_tick INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (pchannel TEXT NOT NULL, seq INTEGER NOT NULL,
    record BLOB NOT NULL, PRIMARY KEY (pchannel, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (pchannel TEXT NOT NULL, name TEXT NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (pchannel, name)) WITHOUT ROWID;
"""


@final
class SqliteMessageId(SequenceMessageId, frozen=True):
    """Position in a ``sqlite://`` pchannel: a dense sequence number from 0."""

    scheme = "sqlite"


def connect(path: str) -> sqlite3.Connection:
    """A connection with explicit transactions, WAL journal, full sync and the schema."""
    conn = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
    try:
        deadline = time.monotonic() + BUSY_SECONDS
        while True:
            try:  # turning a new file to WAL ignores the busy timeout: retry by hand
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(SCHEMA)
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[sqlite3.Connection]:
    """BEGIN (IMMEDIATE, taking the write lock at once, to write) ... COMMIT or ROLLBACK."""
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def guarded(path: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, raising SQLite's errors (a lock held long, a full disk) as retriable."""
    try:
        return fn(*args)
    except sqlite3.Error as exc:
        raise walsvc.BackendUnavailable(f"sqlite WAL {path}: {exc}") from exc


#: In-process wake-ups: (path, pchannel) -> futures of scanners waiting at its end.
waiters: Final[dict[tuple[str, str], set[asyncio.Future[None]]]] = {}


def wake(key: tuple[str, str]) -> None:
    for waiter in waiters.pop(key, ()):
        if not waiter.done():
            waiter.set_result(None)


@final
class SqliteBackend(Backend):
    """One pchannel of a ``sqlite://`` database (see the module docstring)."""

    scheme = "sqlite"
    message_id_class = SqliteMessageId

    def __init__(self, location: str, pchannel: str, read_only: bool) -> None:
        self.path = os.path.abspath(location)
        self.pchannel = pchannel
        self.read_only = read_only
        self.term = 0
        self._key = (self.path, pchannel)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sqlite-wal")
        self._conn: sqlite3.Connection  # made (by open) and used on the worker thread only
        self._closed = False
        self._scanners: set[SqliteScanner] = set()
        self._store: SqliteSubscriptionStore | None = None

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> SqliteBackend:
        if options:
            raise TypeError(f"unknown option(s) for sqlite:// WALs: {', '.join(options)}")
        backend = cls(location, pchannel, read_only)
        try:
            await backend._call(backend._open_sync, max_message_size)
        except BaseException:
            await backend.aclose()
            raise
        return backend

    def _open_sync(self, max_message_size: int) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._conn = connect(self.path)
        if self._conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) < max_message_size:
            raise walsvc.InvalidArgument(f"SQLite cannot store {max_message_size} bytes")
        with transaction(self._conn, write=True) as conn:
            conn.execute("INSERT OR IGNORE INTO logs VALUES (?, 0, 0, 0, 0)", (self.pchannel,))
            if not self.read_only:  # fences every earlier writer
                conn.execute("UPDATE logs SET term = term + 1 WHERE pchannel = ?", (self.pchannel,))
                self.term = self._row(conn)[0]

    def _call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the worker thread, after every call submitted before; once
        the backend is closed, the future raises ``WALClosed``."""
        loop = asyncio.get_running_loop()
        if not self._closed:
            return loop.run_in_executor(self._executor, guarded, self.path, fn, *args)
        failed = loop.create_future()
        failed.set_exception(walsvc.WALClosed(f"sqlite WAL {self.path} {self.pchannel!r} closed"))
        return failed

    def _row(self, conn: sqlite3.Connection) -> Row:
        row = conn.execute(
            "SELECT term, first_seq, next_seq, last_tick FROM logs WHERE pchannel = ?",
            (self.pchannel,),
        ).fetchone()
        return (row[0], row[1], row[2], row[3])  # the row exists from open on

    def _state_sync(self) -> Row:
        with transaction(self._conn, write=False) as conn:
            return self._row(conn)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Row]:
        """A write transaction of this writer, yielding the pchannel's row; it raises
        ``WALFenced`` once a newer writer has opened the pchannel."""
        with transaction(self._conn, write=True) as conn:
            row = self._row(conn)
            if row[0] != self.term:
                raise walsvc.WALFenced(
                    f"sqlite WAL {self.path} {self.pchannel!r}: term {self.term} was fenced"
                    f" by term {row[0]} (another read-write open of the pchannel)"
                )
            yield row

    def append(self, records: Sequence[bytes]) -> Awaitable[Sequence[MessageId]]:
        done = self._call(self._append_sync, list(records))
        done.add_done_callback(lambda _: wake(self._key))
        return done

    def _append_sync(self, records: list[bytes]) -> list[MessageId]:
        with self._writing() as (_, _, first, _):
            rows = [(self.pchannel, first + i, r) for i, r in enumerate(records)]
            self._conn.executemany("INSERT INTO records VALUES (?, ?, ?)", rows)
            self._conn.execute(
                "UPDATE logs SET next_seq = ?, last_tick = ? WHERE pchannel = ?",
                (first + len(records), timetick_of(records[-1]), self.pchannel),
            )
        return [SqliteMessageId(seq) for seq in range(first, first + len(records))]

    async def truncate(self, message_id: MessageId) -> None:
        await self._call(self._truncate_sync, seq_of(message_id))

    def _truncate_sync(self, seq: int) -> None:
        with self._writing() as (_, first, end, _):
            if seq >= end:
                raise walsvc.InvalidArgument(f"cannot truncate through {seq}: not appended yet")
            self._conn.execute(
                "DELETE FROM records WHERE pchannel = ? AND seq <= ?", (self.pchannel, seq)
            )
            self._conn.execute(
                "UPDATE logs SET first_seq = ? WHERE pchannel = ?",
                (max(first, seq + 1), self.pchannel),
            )

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        if self._closed:
            raise walsvc.WALClosed(f"sqlite WAL {self.path} {self.pchannel!r} closed")
        deliver = deliver.backend_policy()  # a checkpoint reads from its id
        start: Start = None  # "all": the first retained record
        if deliver.kind == "latest":  # submitted now: counts every append called before
            start = self._call(lambda: self._state_sync()[2])
        elif deliver.kind != "all":
            seq = seq_of(deliver.message_id)
            start = seq if deliver.kind == "start_from" else seq + 1
        scanner = SqliteScanner(self, start, selected)
        self._scanners.add(scanner)
        return scanner

    def _fetch_sync(self, start: int | None) -> tuple[int, list[tuple[int, bytes]]]:
        """(first retained seq, up to BATCH records from ``start``, or from that seq)."""
        with transaction(self._conn, write=False) as conn:
            first = self._row(conn)[1]
            rows = conn.execute(
                "SELECT seq, record FROM records WHERE pchannel = ? AND seq >= ?"
                " ORDER BY seq LIMIT ?",
                (self.pchannel, first if start is None else start, BATCH),
            ).fetchall()
        return first, rows

    async def latest_message_id(self) -> MessageId | None:
        end = (await self._call(self._state_sync))[2]
        return SqliteMessageId(end - 1) if end else None

    async def last_timetick(self) -> int:
        return (await self._call(self._state_sync))[3]

    def subscriptions(self) -> SqliteSubscriptionStore:
        if self._store is None:
            self._store = SqliteSubscriptionStore(self.path, self.pchannel)
        return self._store

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for scanner in list(self._scanners):
            await scanner.aclose()
        conn = getattr(self, "_conn", None)  # None if open failed before connecting
        if conn is not None:  # queued after the appends submitted: those finish first
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)


@final
class SqliteScanner(BackendScanner):
    """Records of one pchannel from a start, ``BATCH`` rows per query, filtered."""

    reports_position = True

    def __init__(self, backend: SqliteBackend, start: Start, selected: Filter) -> None:
        self._backend = backend
        self._next = start  # a future until the start of a latest() read is known
        self._selected = selected
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def position(self) -> MessageId | None:
        seq = self._next
        return SqliteMessageId(seq - 1) if isinstance(seq, int) and seq > 0 else None

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        backend = self._backend
        while True:
            if self._closed:
                raise walsvc.WALClosed(f"sqlite scanner of {backend.pchannel!r} is closed")
            if isinstance(self._next, asyncio.Future):  # shielded: a cancelled read keeps it
                self._next = await asyncio.shield(self._next)
                continue
            # Registered before the query: an append committed after the query wakes it.
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            waiters.setdefault(backend._key, set()).add(waiter)
            try:
                first, rows = await backend._call(backend._fetch_sync, self._next)
                if self._closed:
                    continue  # (raises at the top)
                if self._next is not None and self._next < first:
                    raise walsvc.WALTruncated(
                        f"sqlite WAL {backend.path} {backend.pchannel!r}: position"
                        f" {self._next} was truncated; the log starts at {first}"
                    )
                if not rows:
                    self._next = first if self._next is None else self._next
                    await asyncio.wait({waiter}, timeout=POLL_SECONDS)
                    continue
                out: list[ImmutableMessage] = []
                for seq, record in rows:
                    out += decode_run(record, seq, SqliteMessageId, self._selected)
                self._next = rows[-1][0] + 1
                if out:
                    return out
            finally:
                self._waiter = None
                waiters.get(backend._key, set()).discard(waiter)

    async def aclose(self) -> None:
        self._closed = True
        self._backend._scanners.discard(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


@final
class SqliteSubscriptionStore(SubscriptionStore):
    """The named subscriptions of a ``sqlite://`` pchannel, a row each in
    ``subscriptions``; each call opens a connection of its own on a worker thread."""

    def __init__(self, path: str, pchannel: str) -> None:
        super().__init__(("sqlite", path, pchannel))  # claims: one per log and pchannel
        self.path = path
        self.pchannel = pchannel

    async def _run(self, sql: str, *args: object) -> list[Any]:
        def run() -> list[Any]:
            with contextlib.closing(connect(self.path)) as conn:
                return conn.execute(sql, (self.pchannel, *args)).fetchall()

        return await asyncio.to_thread(guarded, self.path, run)

    async def _load(self, name: str) -> StoredSubscription | None:
        query = "SELECT data FROM subscriptions WHERE pchannel = ? AND name = ?"
        rows = await self._run(query, name)
        if not rows:
            return None
        return decode_subscription(f"{self.path}#{self.pchannel}/{name}", bytes(rows[0][0]))

    async def _save(self, name: str, stored: StoredSubscription) -> None:
        data = encode_subscription(stored)
        await self._run("INSERT OR REPLACE INTO subscriptions VALUES (?, ?, ?)", name, data)

    async def _delete(self, name: str) -> None:
        await self._run("DELETE FROM subscriptions WHERE pchannel = ? AND name = ?", name)

    async def _names(self) -> list[str]:
        rows = await self._run("SELECT name FROM subscriptions WHERE pchannel = ?")
        return [row[0] for row in rows]


def seq_of(message_id: MessageId | None) -> int:
    if not isinstance(message_id, SqliteMessageId):
        raise walsvc.InvalidArgument(f"{message_id!r} is not a sqlite:// message id")
    return message_id.seq


backend_class = SqliteBackend
