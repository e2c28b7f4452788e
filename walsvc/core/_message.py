"""The message model: what users build (``Message``) and what the log returns
(``ImmutableMessage``), plus the message types and the result of an append.

The header fields (vchannel, type, timetick, ...) travel apart from the opaque payload, so
filters, dedup and ordering never look at the payload.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping

import msgspec

from ._deliver import Checkpoint
from ._errors import InvalidMessage
from ._ids import MessageId

__all__ = (
    "APPLICATION_TYPES",
    "EXCLUSIVE_TYPES",
    "NO_PROPERTIES",
    "SYSTEM_TYPES",
    "AppendResult",
    "ImmutableMessage",
    "Message",
    "MessageType",
    "TxnContext",
    "producer_key",
)

_APPLICATION_FIRST = 10_000
_APPLICATION_LAST = 65_535
#: Message type numbers reserved for applications: ``MessageType(n)`` for n in this range
#: gives a pseudo-member named ``APPLICATION_<n>``; walsvc never assigns them meaning.
APPLICATION_TYPES = range(_APPLICATION_FIRST, _APPLICATION_LAST + 1)

_MAX_VCHANNEL_BYTES = 65_535
#: The properties of every message that has none: one shared read-only empty mapping.
NO_PROPERTIES: Mapping[str, str] = types.MappingProxyType({})


class MessageType(enum.IntEnum):
    """Message types, numbered as in Milvus, plus an application-defined range.

    ``MessageType(n)`` accepts any n in ``APPLICATION_TYPES`` (10000-65535) and returns a
    pseudo-member for it; other unknown numbers raise ``ValueError``.
    """

    TIME_TICK = 1
    INSERT = 2
    DELETE = 3
    FLUSH = 4
    CREATE_COLLECTION = 5
    DROP_COLLECTION = 6
    CREATE_PARTITION = 7
    DROP_PARTITION = 8
    MANUAL_FLUSH = 9
    CREATE_SEGMENT = 10
    IMPORT = 11
    BEGIN_TXN = 900
    COMMIT_TXN = 901
    ROLLBACK_TXN = 902
    TXN = 999

    @classmethod
    def _missing_(cls, value: object) -> MessageType | None:
        if isinstance(value, int) and _APPLICATION_FIRST <= value <= _APPLICATION_LAST:
            member = int.__new__(cls, value)
            member._name_ = f"APPLICATION_{value}"
            member._value_ = value
            # Cache it so identity holds: MessageType(n) is MessageType(n).
            return cls._value2member_map_.setdefault(value, member)  # type: ignore[return-value]
        return None

    @property
    def is_system(self) -> bool:
        """True for types the WAL itself writes (timeticks, txn control); type filters
        never drop these."""
        return self in SYSTEM_TYPES

    @property
    def is_exclusive(self) -> bool:
        """True for DDL-like types that serialize per vchannel and fail its open txns."""
        return self in EXCLUSIVE_TYPES


#: Types written by the WAL itself; never dropped by a type filter.
SYSTEM_TYPES = frozenset(
    {
        MessageType.TIME_TICK,
        MessageType.BEGIN_TXN,
        MessageType.COMMIT_TXN,
        MessageType.ROLLBACK_TXN,
        MessageType.TXN,
    }
)
#: DDL-like types that serialize per vchannel and fail its open transactions.
EXCLUSIVE_TYPES = frozenset(
    {
        MessageType.CREATE_COLLECTION,
        MessageType.DROP_COLLECTION,
        MessageType.CREATE_PARTITION,
        MessageType.DROP_PARTITION,
        MessageType.MANUAL_FLUSH,
    }
)


class TxnContext(msgspec.Struct, frozen=True, array_like=True):
    """The transaction a message belongs to: its id and keepalive in milliseconds."""

    txn_id: int
    keepalive_ms: int


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """A message as a user builds it, before the log assigns its system fields.

    ``payload`` is opaque bytes the WAL never decodes; ``vchannel`` "" means every vchannel
    (a broadcast); ``properties`` is a string map readers get back unchanged.
    ``idempotency_key`` makes retried appends of the same message exactly-once: within
    the dedup window, a retry with the same key on the same vchannel returns the original
    ``AppendResult`` instead of appending again (see ``walsvc.producer_key``).
    ``txn`` is set by the WAL on the control and body messages of a transaction (use
    ``WAL.begin_txn``); ``WAL.append`` refuses user messages that carry one.
    Construction validates field types and raises ``InvalidMessage``.
    """

    payload: bytes
    vchannel: str
    type: MessageType = MessageType.INSERT
    properties: Mapping[str, str] = msgspec.field(default_factory=dict)
    idempotency_key: str | None = None
    txn: TxnContext | None = None

    def __post_init__(self) -> None:
        key = self.idempotency_key
        if (  # the common message, keyed or not: checked in one expression
            type(self.payload) is bytes
            and type(self.vchannel) is str
            and type(self.type) is MessageType
            and type(self.properties) is dict
            and not self.properties
            and (key is None or (type(key) is str and key.isascii()))
            and self.txn is None
            and self.vchannel.isascii()
            and len(self.vchannel) <= _MAX_VCHANNEL_BYTES
        ):
            return
        self._validate()

    def _validate(self) -> None:
        if type(self.payload) is not bytes:
            raise InvalidMessage(
                f"payload must be bytes, not {type(self.payload).__name__}"
                " (convert bytearray/memoryview with bytes(...))"
            )
        if type(self.vchannel) is not str:
            raise InvalidMessage(f"vchannel must be str, not {type(self.vchannel).__name__}")
        if not _is_utf8(self.vchannel):
            raise InvalidMessage(f"vchannel {self.vchannel!r} is not valid UTF-8 text")
        if len(self.vchannel) * 4 > _MAX_VCHANNEL_BYTES and (
            len(self.vchannel.encode()) > _MAX_VCHANNEL_BYTES
        ):
            raise InvalidMessage(f"vchannel is longer than {_MAX_VCHANNEL_BYTES} UTF-8 bytes")
        if type(self.type) is not MessageType:
            if type(self.type) is not int:  # not bool, float or str either
                raise InvalidMessage(
                    f"type {self.type!r} is neither a walsvc.MessageType nor in the"
                    f" application range {_APPLICATION_FIRST}-{_APPLICATION_LAST}"
                )
            try:
                msgspec.structs.force_setattr(self, "type", MessageType(self.type))
            except (ValueError, TypeError):
                raise InvalidMessage(
                    f"type {self.type!r} is neither a walsvc.MessageType nor in the"
                    f" application range {_APPLICATION_FIRST}-{_APPLICATION_LAST}"
                ) from None
        properties = self.properties
        if type(properties) is not dict and not isinstance(properties, Mapping):
            raise InvalidMessage(
                f"properties must be a mapping of str to str, not {type(properties).__name__}"
            )
        for key, value in properties.items():
            if type(key) is not str or type(value) is not str:
                raise InvalidMessage(f"properties must map str to str; got {key!r}: {value!r}")
            if not (_is_utf8(key) and _is_utf8(value)):
                raise InvalidMessage(f"properties {key!r}: {value!r} are not valid UTF-8 text")
        ikey = self.idempotency_key
        if ikey is not None:
            if type(ikey) is not str:
                raise InvalidMessage("idempotency_key must be str or None")
            if not _is_utf8(ikey):
                raise InvalidMessage(f"idempotency_key {ikey!r} is not valid UTF-8 text")
        if self.txn is not None and type(self.txn) is not TxnContext:
            raise InvalidMessage(f"txn must be a walsvc.TxnContext or None, not {self.txn!r}")


def producer_key(producer_id: str, sequence: int) -> str:
    """The idempotency key of message ``sequence`` of producer ``producer_id``: a producer
    that numbers its messages gets exactly-once appends by passing this as
    ``Message(idempotency_key=...)`` and reusing it on every retry of that message."""
    if type(producer_id) is not str or type(sequence) is not int or sequence < 0:
        raise InvalidMessage("producer_key takes a str producer id and an int sequence >= 0")
    return f"{producer_id}#{sequence}"


def _is_utf8(text: str) -> bool:
    """False for text with lone surrogates, which UTF-8 cannot encode."""
    if text.isascii():  # O(1) in CPython: the common case costs nothing
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class ImmutableMessage(msgspec.Struct, frozen=True, gc=False):
    """A message as the log returns it: the user's fields plus the system fields the log
    assigned (id, timetick, last-confirmed id, transaction, idempotency key, writer term).

    ``last_confirmed_id`` is the id from which a reader sees every message with a greater
    timetick, including transactions open at this message; ``term`` is the term of the
    writer that appended it. ``persisted`` is False only for idle TimeTicks, which the WAL
    hands to its own tailing scanners without writing them (their ``message_id`` and
    ``durable_tick`` are the newest durable message's id and timetick; ``durable_tick`` is
    -1 on every persisted message).

    A committed transaction reaches readers as one ``MessageType.TXN`` message: its id,
    timetick, last-confirmed id and term are its CommitTxn's, and ``body`` holds the body
    messages (each carrying the commit's timetick) in log order. ``body`` is empty for
    every other message.

    Because walsvc assigns timeticks where appends are serialized, log order equals
    timetick order: a delivered message also confirms every tick up to its own (all
    messages with a smaller tick are durable and before it), so readers never wait for a
    TimeTick message to deliver data.
    """

    # gc=False: never tracked by the cycle collector. None of its fields can refer back
    # to it (walsvc builds ``properties`` as a read-only copy and ``body`` before the
    # commit that holds it), so it is in no cycle; tracked, the tail cache's messages
    # (64 MB by default) made every full collection walk them all: 28% of a node's CPU
    # with one remote reader tailing (the same run with the collector off: 3.81 -> 2.72 s).
    # A message built by hand must not be put into a mapping it holds.

    message_id: MessageId
    timetick: int
    vchannel: str
    type: MessageType
    payload: bytes
    properties: Mapping[str, str]
    last_confirmed_id: MessageId | None
    txn: TxnContext | None
    idempotency_key: str | None
    term: int
    persisted: bool = True
    body: tuple[ImmutableMessage, ...] = ()
    durable_tick: int = -1

    @property
    def checkpoint(self) -> Checkpoint:
        """Where a reader that handled this message (and everything delivered before it)
        resumes: (last-confirmed id, timetick); see ``DeliverPolicy.from_checkpoint``.
        For an idle TimeTick the timetick is ``durable_tick``, not its own: the idle tick
        is never written, so a later writer (which recovers its tick floor from the log)
        may give its first messages ticks up to the idle tick's."""
        if self.persisted:
            return Checkpoint(self.last_confirmed_id, self.timetick)
        return Checkpoint(self.last_confirmed_id, self.durable_tick)


class AppendResult(msgspec.Struct, frozen=True, gc=False):
    """Where an appended message landed: its id, the timetick the WAL assigned, and its
    last-confirmed id (with the timetick, a checkpoint a reader can resume from)."""

    # gc=False: never tracked by the cycle collector (ids and ints cannot form a cycle).
    # The dedup window keeps one per key (100k by default): tracked, they made every
    # full collection walk them all.

    message_id: MessageId
    timetick: int
    last_confirmed_id: MessageId | None = None
