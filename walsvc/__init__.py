"""walsvc: an asyncio write-ahead log with the semantics of Milvus's streaming WAL.

Open a pchannel with ``await open_wal(url, pchannel)``; append ``Message``s, read
``ImmutableMessage``s through scanners. Backends are chosen by URL scheme.
"""

from ._chain import (
    AppendBatchNext,
    AppendNext,
    BatchInterceptor,
    ChainMember,
    ClosingInterceptor,
    Interceptor,
    InterceptorContext,
    PlainAdmission,
    ReadyInterceptor,
    TxnKeyWindow,
)
from ._codec import EnvelopeHeader, peek
from ._config import WalConfig, load_config, open_node_from_config, open_wal_from_config
from ._deliver import Checkpoint, DeliverPolicy
from ._errors import (
    AppendOutcomeUnknown,
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    InvalidMessage,
    MessageTooLarge,
    RoutingMismatch,
    SubscriptionBusy,
    SubscriptionMismatch,
    TxnAborted,
    TxnBufferFull,
    TxnError,
    TxnExpired,
    TxnNotActive,
    UnknownBackend,
    UnknownTxn,
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
    EXCLUSIVE_TYPES,
    SYSTEM_TYPES,
    AppendResult,
    ImmutableMessage,
    Message,
    MessageType,
    TxnContext,
    producer_key,
)
from ._node import Node, open_node
from ._open import open_wal
from ._registry import known_schemes, register_backend
from ._routing import Routing, balanced_pins
from ._scanner import Scanner
from ._timetick import HybridClock, TimetickAllocator
from ._txn import Txn, TxnState
from ._wal import DEFAULT_MAX_MESSAGE_SIZE, WAL

__all__ = (
    "APPLICATION_TYPES",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "EXCLUSIVE_TYPES",
    "SYSTEM_TYPES",
    "WAL",
    "AppendBatchNext",
    "AppendNext",
    "AppendOutcomeUnknown",
    "AppendResult",
    "BackendUnavailable",
    "BatchInterceptor",
    "ChainMember",
    "Checkpoint",
    "ClosingInterceptor",
    "CorruptRecord",
    "DeliverPolicy",
    "EnvelopeHeader",
    "Filter",
    "HybridClock",
    "ImmutableMessage",
    "Interceptor",
    "InterceptorContext",
    "InvalidArgument",
    "InvalidMessage",
    "Message",
    "MessageId",
    "MessageTooLarge",
    "MessageType",
    "Node",
    "PlainAdmission",
    "ReadyInterceptor",
    "Routing",
    "RoutingMismatch",
    "Scanner",
    "SequenceMessageId",
    "SubscriptionBusy",
    "SubscriptionMismatch",
    "TimetickAllocator",
    "Txn",
    "TxnAborted",
    "TxnBufferFull",
    "TxnContext",
    "TxnError",
    "TxnExpired",
    "TxnKeyWindow",
    "TxnNotActive",
    "TxnState",
    "UnknownBackend",
    "UnknownTxn",
    "WALClosed",
    "WALError",
    "WALFenced",
    "WALReadOnly",
    "WALTruncated",
    "WalConfig",
    "balanced_pins",
    "known_schemes",
    "load_config",
    "open_node",
    "open_node_from_config",
    "open_wal",
    "open_wal_from_config",
    "peek",
    "producer_key",
    "register_backend",
    "unmarshal_message_id",
)
