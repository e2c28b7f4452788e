"""The reference model of the read pipeline's property tests
(``test_scanner_properties.py``, ``test_scanner_fault_properties.py``; their workloads and
readers are in ``_scanner_workload.py``): what each reader must deliver of the raw log.

    model(V) = the log's messages whose vchannel is V or "" (every message for V=None),
               in log order (= tick order, checked), where each transaction with a
               CommitTxn becomes one TXN message at its commit (the commit's id, tick,
               last-confirmed id and term; body: its body messages, each with the
               commit's tick) and every other transaction message disappears.

Persisted TimeTicks are part of the model (vchannel "": every reader sees them; every
reader asks for them with ``timeticks=True``) and are compared field by field like every
other message. Idle TimeTicks (``persisted=False``)
are not in the log, so the comparison leaves them out; every reader's ticks must still
strictly increase, and idle ticks serve as checkpoints and acks like any message.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

import walsvc
from walsvc import ImmutableMessage, MessageType

__all__ = ("after", "after_id", "after_tick", "keys", "log_order_checks", "model")


# ---------------------------------------------------------------------------------------
# The reference model


def log_order_checks(log: Sequence[ImmutableMessage]) -> None:
    """The raw log's own promises the model relies on: log order is tick order, and no
    transaction message follows its transaction's end."""
    ticks = [m.timetick for m in log]
    assert all(a < b for a, b in itertools.pairwise(ticks)), ticks
    ended: set[int] = set()
    for m in log:
        if m.txn is None:
            continue
        assert m.txn.txn_id not in ended, f"{m} follows the end of its transaction"
        if m.type in (MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN):
            ended.add(m.txn.txn_id)


def model(log: Sequence[ImmutableMessage], vchannel: str | None) -> list[ImmutableMessage]:
    """What a reader of ``vchannel`` (None: every message) must see of ``log``."""
    out: list[ImmutableMessage] = []
    open_txns: dict[int, list[ImmutableMessage]] = {}
    for m in log:
        if vchannel is not None and m.vchannel not in (vchannel, ""):
            continue
        if m.txn is None:
            out.append(m)
            continue
        txn_id = m.txn.txn_id
        if m.type is MessageType.BEGIN_TXN:
            assert txn_id not in open_txns, m
            open_txns[txn_id] = []
        elif m.type is MessageType.ROLLBACK_TXN:
            open_txns.pop(txn_id, None)
        elif m.type is MessageType.COMMIT_TXN:
            body = open_txns.pop(txn_id)
            tick = m.timetick
            out.append(
                msgspec.structs.replace(
                    m,
                    type=MessageType.TXN,
                    body=tuple(msgspec.structs.replace(b, timetick=tick) for b in body),
                )
            )
        else:
            open_txns[txn_id].append(m)
    return out


def _key(m: ImmutableMessage) -> tuple[Any, ...]:
    """Every field of a message, in comparable form (cached and decoded messages carry
    their properties in different mapping types)."""
    return (
        m.message_id,
        m.timetick,
        m.vchannel,
        int(m.type),
        m.payload,
        dict(m.properties),
        m.last_confirmed_id,
        m.txn,
        m.idempotency_key,
        m.term,
        m.persisted,
        tuple(_key(b) for b in m.body),
    )


def keys(messages: Sequence[ImmutableMessage]) -> list[tuple[Any, ...]]:
    """The persisted messages of ``messages``, each as every field in comparable form."""
    return [_key(m) for m in messages if m.persisted]


# ---------------------------------------------------------------------------------------
# What a reader opened at a position is due: the model's suffix after it


def after_id(
    before: walsvc.MessageId | None,
) -> Callable[[list[ImmutableMessage]], list[ImmutableMessage]]:
    """The model after the id ``before`` (all of it for None)."""
    return lambda model: [m for m in model if before is None or m.message_id > before]


def after(message: ImmutableMessage) -> Callable[[list[ImmutableMessage]], list[ImmutableMessage]]:
    """The model after ``message`` as delivered: after its position, i.e. its id (an idle
    tick's id is the newest message it confirms; a TXN's, its commit's). For a persisted
    message that is also every message with a greater tick."""
    return after_id(message.message_id)


def after_tick(tick: int) -> Callable[[list[ImmutableMessage]], list[ImmutableMessage]]:
    """The model above the tick ``tick`` (a ``timetick_gt`` reader's)."""
    return lambda model: [m for m in model if m.timetick > tick]
