"""walsvc: an asyncio write-ahead log with the semantics of Milvus's streaming WAL.

Open a pchannel with ``await open_wal(url, pchannel)``; append ``Message``s, read
``ImmutableMessage``s through scanners. Backends are chosen by URL scheme.
"""

from walsvc.apps._config import WalConfig, load_config, open_node_from_config, open_wal_from_config
from walsvc.core._chain import (
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
from walsvc.core._codec import EnvelopeHeader, peek
from walsvc.core._deliver import Checkpoint, DeliverPolicy
from walsvc.core._errors import (
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
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, SequenceMessageId, unmarshal_message_id
from walsvc.core._message import (
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
from walsvc.core._timetick import HybridClock, TimetickAllocator
from walsvc.node._node import Node, open_node
from walsvc.node._routing import Routing, balanced_pins
from walsvc.read._scanner import Scanner
from walsvc.wal._open import open_wal
from walsvc.wal._registry import known_schemes, register_backend
from walsvc.wal._wal import DEFAULT_MAX_MESSAGE_SIZE, WAL
from walsvc.write._txn import Txn, TxnState

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
