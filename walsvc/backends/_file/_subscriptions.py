"""The durable subscriptions of a ``file://`` pchannel: one checkpoint file per name in
the pchannel's ``subscriptions/`` directory, written by rename, claimed across processes
with ``flock`` (see ``FileSubscriptionStore``)."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import secrets
from collections.abc import Callable, Hashable
from functools import partial
from typing import Final, TypeVar, final

from walsvc.backends._subscriptions import (
    MAX_CHECKPOINT_BYTES,
    StoredSubscription,
    SubscriptionStore,
    decode_subscription,
    encode_subscription,
    is_subscription_name,
)
from walsvc.core._errors import BackendUnavailable, SubscriptionBusy, WALError, WALReadOnly

from ._directory import fsync_directory

__all__ = ("FileSubscriptionStore",)

_R = TypeVar("_R")

# The open lock file of each claimed (claim key, name); used only by ``_lock`` and
# ``_unlock``, which run with the process's claims held.
_lock_files: Final[dict[tuple[Hashable, str], int]] = {}


@final
class FileSubscriptionStore(SubscriptionStore):
    """Subscriptions of a ``file://`` pchannel: the file ``subscriptions/<name>`` inside
    the pchannel's directory holds the checkpoint (and scope) of ``name``, with a magic, a
    version and a CRC32C, so a damaged file raises ``CorruptRecord`` instead of resuming anywhere.

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
            with self._claims_held(name) as free:
                if not free:
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
            fsync_directory(os.path.dirname(self.path))  # the new directory's entry
            self._dir_ready = True

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    async def _load(self, name: str) -> StoredSubscription | None:
        path = self._file(name)
        data = await _in_thread(f"cannot read checkpoint file {path}", partial(_read_file, path))
        return None if data is None else decode_subscription(path, data)

    async def _save(self, name: str, stored: StoredSubscription) -> None:
        data = encode_subscription(stored)
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
        fsync_directory(self.path)

    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_directory(self.path)

    def _list(self) -> list[str]:
        try:
            with os.scandir(self.path) as entries:
                return [e.name for e in entries if is_subscription_name(e.name) and e.is_file()]
        except FileNotFoundError:
            return []


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read(MAX_CHECKPOINT_BYTES + 1)
    except FileNotFoundError:
        return None


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
    return name if is_subscription_name(name) else None
