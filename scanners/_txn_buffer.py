"""The transaction buffer: readers see a transaction only once it is committed, as one
``MessageType.TXN`` message.

A BeginTxn opens a buffer for its transaction; body messages are held there; the
CommitTxn releases one TXN message (id, timetick, last-confirmed id and term of the
commit) whose ``body`` holds the body messages in log order, each carrying the commit's
timetick; a RollbackTxn discards the body. A body or commit without a begin is ignored
(the reader started after the begin: a reader resuming from a checkpoint always sees
the begins it needs), and so is a repeated begin. A transaction that expires is rolled
back by its writer, or, if the writer died, by the next writer when it opens; its
RollbackTxn discards the body here.

Memory is bounded: when the bodies held exceed ``max_bytes`` the buffer raises
``TxnBufferFull`` instead of growing or dropping anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import msgspec

from walsvc.core._errors import TxnBufferFull
from walsvc.core._message import ImmutableMessage, MessageType

__all__ = ("TxnBuffer",)

_CONTROL = frozenset({MessageType.BEGIN_TXN, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN})


@final
class _Open:
    __slots__ = ("body", "size")

    def __init__(self) -> None:
        self.body: list[ImmutableMessage] = []
        self.size = 0


@final
class TxnBuffer:
    """Committed transactions for one scanner (see the module docstring)."""

    __slots__ = ("_bytes", "_open", "ignored", "max_bytes")

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._open: dict[int, _Open] = {}
        self._bytes = 0
        #: Transaction messages ignored: bodies and ends without a begin, repeated begins.
        self.ignored = 0

    @property
    def held_bytes(self) -> int:
        """Payload bytes of the bodies held for open transactions."""
        return self._bytes

    @property
    def open_count(self) -> int:
        """How many transactions are open (begun, not yet ended) in what was read."""
        return len(self._open)

    def push(self, batch: Sequence[ImmutableMessage]) -> Sequence[ImmutableMessage]:
        """Take ``batch`` (timetick order) and return what readers see of it."""
        for message in batch:  # the common case: no transaction message, no copy
            if message.txn is not None:
                break
        else:
            return batch
        out: list[ImmutableMessage] = []
        for message in batch:
            if message.txn is None:
                out.append(message)
            else:
                released = self._take(message)
                if released is not None:
                    out.append(released)
        return out

    def _take(self, message: ImmutableMessage) -> ImmutableMessage | None:
        assert message.txn is not None
        txn_id = message.txn.txn_id
        kind = message.type
        held = self._open.get(txn_id)
        if kind not in _CONTROL:
            if held is None:
                self.ignored += 1
                return None
            size = len(message.payload)
            if self._bytes + size > self.max_bytes:
                raise TxnBufferFull(
                    f"transaction {txn_id} on vchannel {message.vchannel!r}: the open"
                    f" transactions' bodies would exceed txn_buffer_bytes={self.max_bytes};"
                    " read with a larger txn_buffer_bytes"
                )
            held.body.append(message)
            held.size += size
            self._bytes += size
            return None
        if kind is MessageType.BEGIN_TXN:
            if held is None:
                self._open[txn_id] = _Open()
            else:
                self.ignored += 1
            return None
        if held is None:
            self.ignored += 1
            return None
        del self._open[txn_id]
        self._bytes -= held.size
        if kind is MessageType.ROLLBACK_TXN:
            return None
        tick = message.timetick
        body = tuple(msgspec.structs.replace(m, timetick=tick) for m in held.body)
        return msgspec.structs.replace(message, type=MessageType.TXN, body=body)
