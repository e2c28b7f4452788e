"""Durable named subscriptions, the store side: where each named reader of a pchannel
resumes, and what it reads.

A ``SubscriptionStore`` keeps one ``StoredSubscription`` per subscription name beside the
log (each backend has its own store: ``memory://`` in the process, ``file://`` one small
file per name, the brokers a keyed topic): the checkpoint to resume from and the
``SubscriptionScope`` (which vchannels and types) the subscription reads.
``encode_subscription`` is the stored form every durable store writes. The reader side,
which throttles a scanner's acknowledgements into ``save`` calls, is
``walsvc.read._checkpoints``.
"""

from __future__ import annotations

import hashlib
import re
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Final, final

import msgspec
from crc32c import crc32c

from walsvc.core._deliver import Checkpoint
from walsvc.core._errors import (
    CorruptRecord,
    InvalidArgument,
    SubscriptionBusy,
    SubscriptionMismatch,
)
from walsvc.core._filter import Filter
from walsvc.core._message import MessageType

__all__ = (
    "MAX_CHECKPOINT_BYTES",
    "StoredSubscription",
    "SubscriptionScope",
    "SubscriptionStore",
    "check_checkpoint_interval",
    "check_scope",
    "check_subscription_name",
    "decode_subscription",
    "encode_subscription",
    "is_subscription_name",
)

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


def check_checkpoint_interval(seconds: float) -> float:
    """Return ``seconds`` as a float if it is a checkpoint interval ``WAL.read`` takes
    (a number in [0, 3600], not a bool); raise ``InvalidArgument`` otherwise."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds <= 3600
    ):
        raise InvalidArgument(f"checkpoint_interval must be in [0, 3600] seconds, not {seconds!r}")
    return float(seconds)


def is_subscription_name(name: str) -> bool:
    """True if ``name`` is a valid subscription name (see ``check_subscription_name``)."""
    return _NAME.fullmatch(name) is not None


_MAX_DESCRIPTION: Final = 200


@final
class SubscriptionScope(msgspec.Struct, frozen=True):
    """Which messages a subscription reads: the vchannels and message types of its
    filter, as a digest (SHA-256 of the sorted sets; equal exactly when both sets are
    equal) and a short description for error messages (at most 200 ASCII characters).
    A scanner's ``min_timetick`` is not part of it: resuming skips what it skipped."""

    digest: str
    description: str

    @classmethod
    def of(cls, selected: Filter) -> SubscriptionScope:
        """The scope of a scanner reading with the combined filter ``selected``."""
        vchannels = None if selected.vchannels is None else sorted(selected.vchannels)
        types = None if selected.types is None else sorted(selected.types)
        canonical = msgspec.json.encode({"vchannels": vchannels, "types": types})
        described = (
            f"vchannels {'(any)' if vchannels is None else ascii(vchannels)},"
            f" types {'(any)' if types is None else _type_names(types)}"
        )
        if len(described) > _MAX_DESCRIPTION:
            described = described[: _MAX_DESCRIPTION - 3] + "..."
        return cls(hashlib.sha256(canonical).hexdigest(), described)


def _type_names(types: list[int]) -> str:
    names = []
    for value in types:
        try:
            names.append(MessageType(value).name)
        except ValueError:
            names.append(str(value))
    return "[" + ", ".join(names) + "]"


@final
class StoredSubscription(msgspec.Struct, frozen=True):
    """What a store keeps for one subscription: the checkpoint it resumes after, and the
    scope it reads (None for one stored before walsvc kept scopes: the next write of its
    checkpoint records the scope of the scanner that writes it)."""

    checkpoint: Checkpoint
    scope: SubscriptionScope | None


def check_scope(name: str, stored: SubscriptionScope | None, wanted: SubscriptionScope) -> None:
    """Raise ``SubscriptionMismatch`` if subscription ``name`` was stored with another
    scope than ``wanted``: its checkpoint says how far it read of other messages."""
    if stored is not None and stored.digest != wanted.digest:
        raise SubscriptionMismatch(
            f"subscription {name!r} reads {stored.description}; this scanner asks for"
            f" {wanted.description}. Its checkpoint is a position in the messages it reads,"
            " so a different filter would skip or repeat messages: read with the same"
            " filter, use another subscription name, or delete this one"
            " (WAL.delete_subscription) to start it again."
        )


# Claims are process-wide: every store instance for the same log and pchannel shares them.
_claims_lock: Final = threading.Lock()
_claims: Final[dict[Hashable, set[str]]] = {}


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
        stored = await self.load_stored(name)
        return None if stored is None else stored.checkpoint

    async def load_stored(self, name: str) -> StoredSubscription | None:
        """The checkpoint and scope last saved under ``name``, or None (as ``load``)."""
        return await self._load(check_subscription_name(name))

    async def save(
        self, name: str, checkpoint: Checkpoint, scope: SubscriptionScope | None = None
    ) -> None:
        """Store ``checkpoint`` (and the ``scope`` it is a position in, if given) under
        ``name``, replacing the previous one. Durable when it returns: a crash afterwards
        keeps it; a crash before leaves the previous one or the new one, whole. Raises
        ``BackendUnavailable`` if the store cannot be written."""
        check_subscription_name(name)
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"save takes a walsvc.Checkpoint, not {checkpoint!r}")
        if scope is not None and not isinstance(scope, SubscriptionScope):
            raise TypeError(f"scope must be a SubscriptionScope or None, not {scope!r}")
        await self._save(name, StoredSubscription(checkpoint, scope))

    async def delete(self, name: str) -> None:
        """Forget the checkpoint of ``name`` (durably). Deleting a missing one does
        nothing."""
        await self._delete(check_subscription_name(name))

    async def names(self) -> list[str]:
        """The names that have a stored checkpoint, sorted."""
        return sorted(await self._names())

    async def listed(
        self, limit: int | None = None
    ) -> tuple[list[tuple[str, StoredSubscription]], int]:
        """The first ``limit`` (default: all) stored subscriptions by name, each with
        what ``load_stored`` returns (one deleted meanwhile is left out), and how many
        names there are beyond them."""
        names = await self.names()
        shown = names if limit is None else names[:limit]
        found = [(name, await self._load(name)) for name in shown]
        return [(n, s) for n, s in found if s is not None], len(names) - len(shown)

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

    @contextmanager
    def _claims_held(self, name: str) -> Iterator[bool]:
        """Hold this process's claims (no claim or release starts meanwhile) and say
        whether ``name`` is free in this process (False: a scanner here reads it)."""
        with _claims_lock:
            yield name not in _claims.get(self._claim_key, ())

    def _lock(self, name: str) -> None:  # noqa: B027 (a hook; most stores need none)
        """Hook: claim ``name`` against other processes (raise ``SubscriptionBusy``).
        Runs with this process's claims held, as does ``_unlock``."""

    def _unlock(self, name: str) -> None:  # noqa: B027
        """Hook: end what ``_lock`` claimed."""

    @abstractmethod
    async def _load(self, name: str) -> StoredSubscription | None: ...

    @abstractmethod
    async def _save(self, name: str, stored: StoredSubscription) -> None: ...

    @abstractmethod
    async def _delete(self, name: str) -> None: ...

    @abstractmethod
    async def _names(self) -> list[str]: ...


# ---------------------------------------------------------------------------------------
# The stored form, shared by every durable store

_MAGIC: Final = b"WSUB"
#: 1: the checkpoint alone; 2: the checkpoint, then a line with the scope's digest and a
#: line with its description (both empty: no scope). Version 1 still reads.
_VERSION: Final = 2
# magic, CRC32C of everything after it, version, body length; then the body: ASCII text,
# the checkpoint's marshal() (and in version 2 the scope's two lines).
_HEADER: Final = struct.Struct("<4sIBI")
_MAX_BODY: Final = 1024
#: The most bytes a stored subscription takes (a reader need not read more to decode it).
MAX_CHECKPOINT_BYTES: Final = _HEADER.size + _MAX_BODY


def encode_subscription(stored: StoredSubscription) -> bytes:
    """The stored form of ``stored`` (a file of ``file://``, a record value of the
    brokers): a magic, a CRC32C, a version and ASCII text (the checkpoint's
    ``marshal()``, the scope's digest and description), at most ``MAX_CHECKPOINT_BYTES``."""
    scope = stored.scope
    lines = [stored.checkpoint.marshal()]
    lines += ["", ""] if scope is None else [scope.digest, scope.description]
    body = "\n".join(lines).encode("ascii")
    if len(body) > _MAX_BODY:
        raise InvalidArgument(f"subscription {stored!r} is too long to store")
    tail = struct.pack("<BI", _VERSION, len(body)) + body
    return _MAGIC + crc32c(tail).to_bytes(4, "little") + tail


def decode_subscription(path: str, data: bytes) -> StoredSubscription:
    """The stored subscription in ``data`` (the content of the file, or record, at
    ``path``); raise ``CorruptRecord`` naming ``path`` if it is truncated, damaged or not a
    stored subscription."""
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
    if version not in (1, 2):
        raise CorruptRecord(f"{path}: unsupported checkpoint file version {version}")
    try:
        text = data[_HEADER.size :].decode("ascii")
    except UnicodeDecodeError as exc:
        raise CorruptRecord(f"{path}: checkpoint is not ASCII text") from exc
    lines = text.split("\n") if version == 2 else [text, "", ""]
    if len(lines) != 3:
        raise CorruptRecord(f"{path}: checkpoint has {len(lines)} lines, not 3")
    marshalled, digest, description = lines
    try:
        checkpoint = Checkpoint.unmarshal(marshalled)
    except CorruptRecord as exc:
        raise CorruptRecord(f"{path}: {exc}") from exc
    if not digest:
        return StoredSubscription(checkpoint, None)
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise CorruptRecord(f"{path}: checkpoint's scope digest {digest!r} is not SHA-256 hex")
    return StoredSubscription(checkpoint, SubscriptionScope(digest, description))
