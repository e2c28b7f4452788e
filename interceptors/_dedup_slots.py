"""The dedup window's slots: what it holds per key, and the keys themselves.

A window key is a vchannel and an idempotency key (``key_of``); its slot is a settled
message key's ``AppendResult`` (most keys) or an ``Entry``: in flight, blocked, or a
settled transaction key. ``Window`` (``_dedup_window``) keeps them; ``Runs``
(``_dedup_runs``) keeps the keys of a counted batch in one ``Run``.
"""

from __future__ import annotations

import asyncio
from typing import Any, final

import msgspec

from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, MessageType

__all__ = (
    "Entry",
    "Key",
    "Slot",
    "in_flight",
    "key_of",
    "named",
    "result_of",
    "settled_key",
)

#: A key of the window: ``vchannel + "\0" + idempotency key`` (no NUL in the vchannel: the
#: first NUL ends it), else the tuple (vchannel, idempotency key). A str is hashed once and
#: is no work for the cycle collector, which a tuple per key kept in the window was.
Key = str | tuple[str, str]


@final
class Entry(msgspec.Struct, gc=False):
    """A key of the window that is not a settled message key: in flight (``owner``
    running), blocked (no ``owner``, no ``result``: its outcome could not be read), or a
    settled transaction key (``result``, ``txn``). The keys of one batch share one.

    Neither it nor an ``AppendResult`` is tracked by the cycle collector, so the
    window's table, which holds only them and str keys, is never tracked either: a
    collection does not read a window of a million keys. In return it must be in no
    reference cycle: its owner, whose coroutine refers to it, is dropped once done
    (``drop_owner``)."""

    #: At or before where the keyed messages land: resolution reads from here.
    floor: MessageId | None
    #: True if the key names a transaction (settled by its CommitTxn).
    txn: bool
    result: AppendResult | None = None
    #: The append that settles the keys, while it runs.
    owner: asyncio.Future[Any] | None = None

    def drop_owner(self, owner: asyncio.Future[Any]) -> None:
        """Forget ``owner``, done, unless another owns the keys since."""
        if self.owner is owner:
            self.owner = None


#: What the window holds per key: a settled message key's result (most keys), or an
#: ``Entry``.
Slot = AppendResult | Entry


def in_flight(slot: Slot) -> bool:
    """True for a key whose append is in flight or blocked (no result yet)."""
    return type(slot) is Entry and slot.result is None


def settled_key(message: ImmutableMessage) -> Key | None:
    """The window key a message in the log settles: a keyed message outside
    transactions, or a transaction's CommitTxn."""
    key = message.idempotency_key
    if key is None or (message.txn is not None and message.type is not MessageType.COMMIT_TXN):
        return None
    return key_of(message.vchannel, key)


def key_of(vchannel: str, key: str) -> Key:
    """The window key of idempotency key ``key`` on ``vchannel``."""
    return f"{vchannel}\0{key}" if "\0" not in vchannel else (vchannel, key)


def named(key: Key) -> str:
    """A window key as error messages name it: the key, then its vchannel."""
    vchannel, key_text = key.split("\0", 1) if isinstance(key, str) else key
    return f"{key_text!r} on vchannel {vchannel!r}"


def result_of(message: ImmutableMessage) -> AppendResult:
    """The ``AppendResult`` an append of ``message`` returned."""
    return AppendResult(message.message_id, message.timetick, message.last_confirmed_id)
