"""walsvc: an asyncio write-ahead log with the semantics of Milvus's streaming WAL.

Open a pchannel with ``await open_wal(url, pchannel)``; append ``Message``s, read
``ImmutableMessage``s through scanners. Backends are chosen by URL scheme.
"""

from ._codec import EnvelopeHeader, peek
from ._deliver import DeliverPolicy
from ._errors import (
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    InvalidMessage,
    MessageTooLarge,
    UnknownBackend,
    WALClosed,
    WALError,
    WALFenced,
    WALReadOnly,
    WALTruncated,
)
from ._filter import Filter
from ._ids import MessageId, SequenceMessageId, unmarshal_message_id
from ._message import (
    APPLICATION_TYPES,
    SYSTEM_TYPES,
    AppendResult,
    ImmutableMessage,
    Message,
    MessageType,
    TxnContext,
)
from ._open import open_wal
from ._registry import known_schemes, register_backend
from ._scanner import Scanner
from ._timetick import HybridClock, TimetickAllocator
from ._wal import DEFAULT_MAX_MESSAGE_SIZE, WAL

__all__ = (
    "APPLICATION_TYPES",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "SYSTEM_TYPES",
    "WAL",
    "AppendResult",
    "BackendUnavailable",
    "CorruptRecord",
    "DeliverPolicy",
    "EnvelopeHeader",
    "Filter",
    "HybridClock",
    "ImmutableMessage",
    "InvalidArgument",
    "InvalidMessage",
    "Message",
    "MessageId",
    "MessageTooLarge",
    "MessageType",
    "Scanner",
    "SequenceMessageId",
    "TimetickAllocator",
    "TxnContext",
    "UnknownBackend",
    "WALClosed",
    "WALError",
    "WALFenced",
    "WALReadOnly",
    "WALTruncated",
    "known_schemes",
    "open_wal",
    "peek",
    "register_backend",
    "unmarshal_message_id",
)
