"""Durable named subscriptions: where each named reader of a pchannel resumes.

A ``SubscriptionStore`` keeps one ``Checkpoint`` per subscription name beside the log
(``memory://``: in the process; ``file://``: one small file per name in the pchannel's
``subscriptions/`` directory). A ``CheckpointWriter`` takes a reader's acknowledgements
(``note``) and writes the newest one to the store, forward-only and throttled.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import math
import os
import re
import secrets
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from functools import partial
from typing import Final, TypeVar, final

from crc32c import crc32c

from ._deliver import Checkpoint
from ._errors import (
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    SubscriptionBusy,
    WALClosed,
    WALError,
    WALReadOnly,
)

__all__ = (
    "CheckpointWriter",
    "FileSubscriptionStore",
    "MemorySubscriptionStore",
    "SubscriptionStore",
    "check_subscription_name",
)

_R = TypeVar("_R")

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_subscription_name(name: str) -> str:
    """Return ``name`` if it is a valid subscription name (1-200 characters of
    ``[A-Za-z0-9._-]``, starting with a letter or digit); raise ``InvalidArgument``
    otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"subscription name {name!r} must be 1-200 characters of [A-Za-z0-9._-],"
            " starting with a letter or digit"
        )
    return name


# Claims are process-wide: every store instance for the same log and pchannel shares them.
_claims_lock: Final = threading.Lock()
_claims: Final[dict[Hashable, set[str]]] = {}
# file://: the open lock file of each claimed (claim key, name), guarded by _claims_lock.
_lock_files: Final[dict[tuple[Hashable, str], int]] = {}


class SubscriptionStore(ABC):
    """The durable checkpoints of one pchannel's named subscriptions.

    Every method checks the name first (``InvalidArgument`` for an invalid one).
    Subclasses implement ``_load``, ``_save``, ``_delete`` and ``_names`` and pass a key
    naming their log and pchannel to ``__init__``: claims are shared by every store
    instance built with an equal key.
    """

    __slots__ = ("_claim_key",)

    def __init__(self, claim_key: Hashable) -> None:
        self._claim_key = claim_key

    async def load(self, name: str) -> Checkpoint | None:
        """The checkpoint last saved under ``name``, or None if there is none. Raises
        ``CorruptRecord`` if the stored checkpoint fails its checks."""
        return await self._load(check_subscription_name(name))

    async def save(self, name: str, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint`` under ``name``, replacing the previous one. Durable when it
        returns: a crash afterwards keeps it; a crash before leaves the previous one or the
        new one, whole. Raises ``BackendUnavailable`` if the store cannot be written."""
        check_subscription_name(name)
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"save takes a walsvc.Checkpoint, not {checkpoint!r}")
        await self._save(name, checkpoint)

    async def delete(self, name: str) -> None:
        """Forget the checkpoint of ``name`` (durably). Deleting a missing one does
        nothing."""
        await self._delete(check_subscription_name(name))

    async def names(self) -> list[str]:
        """The names that have a stored checkpoint, sorted."""
        return sorted(await self._names())

    def claim(self, name: str) -> None:
        """Mark ``name`` as read by one scanner; raise ``SubscriptionBusy`` if a scanner
        already reads it, through any store instance for the same log and pchannel in
        this process, or (where the store can tell: ``file://``) in another process."""
        check_subscription_name(name)
        with _claims_lock:
            held = _claims.setdefault(self._claim_key, set())
            if name in held:
                raise SubscriptionBusy(
                    f"subscription {name!r} is already being read by a scanner of this process"
                )
            self._lock(name)
            held.add(name)

    def release(self, name: str) -> None:
        """End the claim on ``name`` (only its holder should call this); releasing a name
        that is not claimed does nothing."""
        check_subscription_name(name)
        with _claims_lock:
            held = _claims.get(self._claim_key)
            if held is not None and name in held:
                held.discard(name)
                self._unlock(name)
                if not held:
                    del _claims[self._claim_key]

    def _lock(self, name: str) -> None:  # noqa: B027 (a hook; most stores need none)
        """Hook: claim ``name`` against other processes (raise ``SubscriptionBusy``)."""

    def _unlock(self, name: str) -> None:  # noqa: B027
        """Hook: end what ``_lock`` claimed."""

    @abstractmethod
    async def _load(self, name: str) -> Checkpoint | None: ...

    @abstractmethod
    async def _save(self, name: str, checkpoint: Checkpoint) -> None: ...

    @abstractmethod
    async def _delete(self, name: str) -> None: ...

    @abstractmethod
    async def _names(self) -> list[str]: ...


# ---------------------------------------------------------------------------------------
# The throttled writer


@final
class CheckpointWriter:
    """Writes one subscription's newest acknowledged checkpoint to its store, forward-only
    and throttled. Use it from one event loop.

    ``note`` keeps the checkpoint with the greatest timetick; one at or below the greatest
    noted so far, or below ``start`` (the checkpoint ``load`` returned), is ignored. At most
    one write is in flight and writes start at least ``interval`` seconds apart: the first
    note after a quiet period is written at once, later ones when the period ends (a timer
    writes the newest; no further note is needed).

    A failed background write keeps its checkpoint pending (unless a newer one was noted)
    and schedules no retry; its error (``BackendUnavailable`` wrapping anything that is not
    a ``WALError``) is raised once, by the next ``note``, ``flush`` or ``aclose``, after that
    call has done its own work.
    """

    __slots__ = (
        "_closed",
        "_failure",
        "_floor",
        "_inflight",
        "_interval",
        "_last_start",
        "_store",
        "_timer",
        "name",
        "pending",
        "writes",
        "written",
    )

    def __init__(
        self,
        store: SubscriptionStore,
        name: str,
        *,
        interval: float = 1.0,
        start: Checkpoint | None = None,
    ) -> None:
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not (interval >= 0 and math.isfinite(interval))
        ):
            raise InvalidArgument(f"interval must be a number of seconds >= 0, not {interval!r}")
        if start is not None and not isinstance(start, Checkpoint):
            raise TypeError(f"start must be a walsvc.Checkpoint or None, not {start!r}")
        self._store = store
        #: The subscription's name.
        self.name = check_subscription_name(name)
        self._interval = float(interval)
        #: The newest checkpoint known to be durable: ``start`` until a write succeeds.
        self.written = start
        #: The newest noted checkpoint not yet handed to the store, or None.
        self.pending: Checkpoint | None = None
        #: How many store writes were started (failed ones included).
        self.writes = 0
        self._floor = -1 if start is None else start.timetick
        self._failure: WALError | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_start = -math.inf
        self._closed = False

    def note(self, checkpoint: Checkpoint) -> None:
        """Record ``checkpoint`` as acknowledged if its timetick is greater than every one
        noted before (else ignore it) and make sure a write is scheduled. Raises
        ``WALClosed`` after ``aclose``, and the error of a failed background write."""
        if self._closed:
            raise WALClosed(f"the checkpoint writer of subscription {self.name!r} is closed")
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"note takes a walsvc.Checkpoint, not {checkpoint!r}")
        if checkpoint.timetick > self._floor:
            self._floor = checkpoint.timetick
            self.pending = checkpoint
        if self.pending is not None and self._inflight is None and self._timer is None:
            self._schedule()
        failure = self._take_failure()
        if failure is not None:
            raise failure

    async def flush(self) -> None:
        """Write the pending checkpoint now (after the write in flight, without waiting for
        the interval). When it returns, every checkpoint noted before the call is durable.
        Raises the error of this write, else that of an earlier failed background write.
        Does nothing after ``aclose``."""
        if not self._closed:
            await self._flush()

    async def aclose(self) -> None:
        """Flush (as ``flush`` does, raising its error) and stop: ``note`` raises
        ``WALClosed`` from now on, and no write starts after this returns. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cancel_timer()
        await self._flush()

    async def _flush(self) -> None:
        earlier = self._take_failure()
        target = self._floor
        while True:
            inflight = self._inflight
            if inflight is not None:
                await asyncio.shield(inflight)
                continue
            written = self.written
            if (
                self._failure is not None
                or self.pending is None
                or (written is not None and written.timetick >= target)
            ):
                break
            self._start_write()
        failure = self._take_failure() or earlier
        if failure is not None:
            raise failure

    def _take_failure(self) -> WALError | None:
        failure, self._failure = self._failure, None
        return failure

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        """Start the pending write now if the interval allows, else when it does."""
        loop = asyncio.get_running_loop()
        delay = self._last_start + self._interval - loop.time()
        if delay <= 0:
            self._start_write()
        else:
            self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if (
            not self._closed
            and self._inflight is None
            and self._failure is None
            and self.pending is not None
        ):
            self._start_write()

    def _start_write(self) -> None:
        self._cancel_timer()
        checkpoint = self.pending
        assert checkpoint is not None
        self.pending = None
        loop = asyncio.get_running_loop()
        self._last_start = loop.time()
        self.writes += 1
        self._inflight = loop.create_task(
            self._write(checkpoint), name=f"walsvc checkpoint {self.name}"
        )

    async def _write(self, checkpoint: Checkpoint) -> None:
        """The in-flight write: never raises (but for cancellation); a failure is kept in
        ``_failure`` for the next call to raise."""
        try:
            await self._store.save(self.name, checkpoint)
        except asyncio.CancelledError:
            self._inflight = None
            self._restore(checkpoint)
            raise
        except Exception as exc:  # kept and raised by the next call, never dropped
            self._inflight = None
            self._restore(checkpoint)
            if isinstance(exc, WALError):
                failure = exc
            else:
                failure = BackendUnavailable(
                    f"saving the checkpoint of subscription {self.name!r} failed: {exc!r}"
                )
                failure.__cause__ = exc  # as ``raise ... from exc`` does
                failure.__suppress_context__ = True
            if self._failure is None:
                self._failure = failure
            return
        self._inflight = None
        written = self.written
        if written is None or checkpoint.timetick > written.timetick:
            self.written = checkpoint
        if not self._closed and self.pending is not None and self._timer is None:
            self._schedule()

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Put back a checkpoint whose write did not complete, unless a newer one waits."""
        if self.pending is None:
            self.pending = checkpoint


# ---------------------------------------------------------------------------------------
# memory://

_memory: Final[dict[tuple[str, str], dict[str, Checkpoint]]] = {}


@final
class MemorySubscriptionStore(SubscriptionStore):
    """Subscriptions of a ``memory://`` pchannel. Like the memory logs they live for the
    life of the process, keyed by (location, pchannel), so a WAL reopened on the same URL
    sees them."""

    __slots__ = ("_checkpoints",)

    def __init__(self, location: str, pchannel: str) -> None:
        super().__init__(("memory", location, pchannel))
        self._checkpoints = _memory.setdefault((location, pchannel), {})

    async def _load(self, name: str) -> Checkpoint | None:
        return self._checkpoints.get(name)

    async def _save(self, name: str, checkpoint: Checkpoint) -> None:
        self._checkpoints[name] = checkpoint

    async def _delete(self, name: str) -> None:
        self._checkpoints.pop(name, None)

    async def _names(self) -> list[str]:
        return list(self._checkpoints)


# ---------------------------------------------------------------------------------------
# file://

_MAGIC: Final = b"WSUB"
_VERSION: Final = 1
# magic, CRC32C of everything after it, version, body length; then the body: the
# checkpoint's marshal() text in ASCII.
_HEADER: Final = struct.Struct("<4sIBI")
_MAX_BODY: Final = 1024


def _encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The bytes of a checkpoint file holding ``checkpoint``."""
    body = checkpoint.marshal().encode("ascii")
    if len(body) > _MAX_BODY:
        raise InvalidArgument(f"checkpoint {checkpoint!r} is too long to store")
    tail = struct.pack("<BI", _VERSION, len(body)) + body
    return _MAGIC + crc32c(tail).to_bytes(4, "little") + tail


def _decode_checkpoint(path: str, data: bytes) -> Checkpoint:
    """The checkpoint in ``data`` (the content of the file at ``path``); raise
    ``CorruptRecord`` naming ``path`` if it is truncated, damaged or not a checkpoint
    file."""
    if len(data) < _HEADER.size:
        raise CorruptRecord(f"{path}: checkpoint file is truncated ({len(data)} bytes)")
    magic, crc, version, length = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptRecord(f"{path}: not a walsvc checkpoint file (magic {magic!r})")
    expected = _HEADER.size + length
    if len(data) != expected:
        raise CorruptRecord(
            f"{path}: checkpoint file is truncated or damaged: {len(data)} bytes, its header"
            f" says {expected}"
        )
    if crc != crc32c(data[len(_MAGIC) + 4 :]):
        raise CorruptRecord(f"{path}: checkpoint file fails its CRC32C check")
    if version != _VERSION:
        raise CorruptRecord(f"{path}: unsupported checkpoint file version {version}")
    try:
        return Checkpoint.unmarshal(data[_HEADER.size :].decode("ascii"))
    except UnicodeDecodeError as exc:
        raise CorruptRecord(f"{path}: checkpoint is not ASCII text") from exc
    except CorruptRecord as exc:
        raise CorruptRecord(f"{path}: {exc}") from exc


@final
class FileSubscriptionStore(SubscriptionStore):
    """Subscriptions of a ``file://`` pchannel: the file ``subscriptions/<name>`` inside
    the pchannel's directory holds the checkpoint of ``name``, with a magic, a version and
    a CRC32C, so a damaged file raises ``CorruptRecord`` instead of resuming anywhere.

    A save writes a hidden temporary file (``.<name>.<random>.tmp``: names cannot start
    with a dot, so it never collides with a subscription), fsyncs it, renames it over the
    old file and fsyncs the directory. Blocking I/O runs in a worker thread. Works on a
    read-only opened WAL too (the directory is created on the first save or claim).

    A claim also takes an exclusive ``flock`` on ``.<name>.lock`` (holding the claimer's
    pid), so a scanner of another process reading the same subscription gets
    ``SubscriptionBusy``; the kernel drops the lock when its process dies.
    """

    __slots__ = ("_dir_ready", "path")

    def __init__(self, pchannel_path: str) -> None:
        super().__init__(("file", os.path.realpath(pchannel_path)))
        #: The directory holding the checkpoint files.
        self.path = os.path.join(pchannel_path, "subscriptions")
        self._dir_ready = False

    def _lock(self, name: str) -> None:
        path = self._lock_path(name)
        try:
            self._make_dir()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _store_error(f"cannot lock subscription {name!r} ({path})", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise SubscriptionBusy(
                f"subscription {name!r} is already being read by a scanner of another"
                f" process (pid {holder}; lock file {path})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # who holds it, for the SubscriptionBusy of others; a full disk may refuse
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        except OSError:
            pass
        _lock_files[(self._claim_key, name)] = fd
        self._remove_temporaries(name)  # a save of an earlier holder that never finished

    def sweep(self) -> None:
        """Remove the temporary files of saves that never finished (their writer was
        killed) for every name no scanner holds now. Blocking: call from a worker thread.
        Errors are left for the saves to report."""
        try:
            names = {_temporary_owner(entry) for entry in os.listdir(self.path)}
        except OSError:
            return
        for name in names - {None}:
            assert name is not None
            with _claims_lock:
                if name in _claims.get(self._claim_key, ()):
                    continue  # claimed in this process: its writer may be saving
                try:
                    fd = os.open(self._lock_path(name), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    fd = -1
                except OSError:
                    continue
                try:
                    if fd >= 0:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue  # claimed by another process
                try:
                    self._remove_temporaries(name)
                finally:
                    if fd >= 0:
                        os.close(fd)

    def _remove_temporaries(self, name: str) -> None:
        try:
            for entry in os.listdir(self.path):
                if _temporary_owner(entry) == name:
                    os.unlink(os.path.join(self.path, entry))
        except OSError:
            pass

    def _lock_path(self, name: str) -> str:
        return os.path.join(self.path, f".{name}.lock")

    def _unlock(self, name: str) -> None:
        fd = _lock_files.pop((self._claim_key, name), None)
        if fd is not None:
            os.close(fd)  # releases the flock

    def _make_dir(self) -> None:
        if not self._dir_ready:
            os.makedirs(self.path, exist_ok=True)
            _fsync_directory(os.path.dirname(self.path))  # the new directory's entry
            self._dir_ready = True

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    async def _load(self, name: str) -> Checkpoint | None:
        path = self._file(name)
        data = await _in_thread(f"cannot read checkpoint file {path}", partial(_read_file, path))
        return None if data is None else _decode_checkpoint(path, data)

    async def _save(self, name: str, checkpoint: Checkpoint) -> None:
        data = _encode_checkpoint(checkpoint)
        path = self._file(name)
        await _in_thread(f"cannot write checkpoint file {path}", partial(self._write, name, data))

    async def _delete(self, name: str) -> None:
        path = self._file(name)
        await _in_thread(f"cannot delete checkpoint file {path}", partial(self._unlink, path))

    async def _names(self) -> list[str]:
        return await _in_thread(f"cannot list subscriptions in {self.path}", self._list)

    # -- worker-thread halves --

    def _write(self, name: str, data: bytes) -> None:
        self._make_dir()
        tmp = os.path.join(self.path, f".{name}.{secrets.token_hex(8)}{_TEMPORARY}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._file(name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_directory(self.path)

    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        _fsync_directory(self.path)

    def _list(self) -> list[str]:
        try:
            with os.scandir(self.path) as entries:
                return [e.name for e in entries if _NAME.fullmatch(e.name) and e.is_file()]
        except FileNotFoundError:
            return []


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read(_HEADER.size + _MAX_BODY + 1)
    except FileNotFoundError:
        return None


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _in_thread(what: str, call: Callable[[], _R]) -> _R:
    """``call()`` in a worker thread, with ``OSError`` translated (``_store_error``)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(None, call)
    except OSError as exc:
        raise _store_error(what, exc) from exc


def _store_error(what: str, exc: OSError) -> WALError:
    """A store's ``OSError`` as a WALError: ``WALReadOnly`` where the directory cannot be
    written at all (a read-only mount, no permission), else ``BackendUnavailable``
    (a full disk, an I/O error: a later try may succeed)."""
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return WALReadOnly(
            f"{what}: {exc}; durable subscriptions keep their checkpoints beside the log,"
            " and this process cannot write there"
        )
    return BackendUnavailable(f"{what}: {exc}")


_TEMPORARY: Final = ".tmp"


def _temporary_owner(entry: str) -> str | None:
    """The subscription name a save's temporary file ``.<name>.<random>.tmp`` is for."""
    if not (entry.startswith(".") and entry.endswith(_TEMPORARY)):
        return None
    name, _, _ = entry[1 : -len(_TEMPORARY)].rpartition(".")
    return name if _NAME.fullmatch(name) else None
