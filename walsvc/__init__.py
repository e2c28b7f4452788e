"""walsvc: an asyncio write-ahead log with the semantics of Milvus's streaming WAL.

Open a pchannel with ``await open_wal(url, pchannel)``; append ``Message``s, read
``ImmutableMessage``s through scanners. Backends are chosen by URL scheme. Implementers of
backends, subscription stores and interceptors find their interfaces in ``walsvc.abc``.

The names load at their first use (PEP 562), all together: importing one of walsvc's
inner modules (as ``interceptors`` and ``scanners`` do) does not drag the whole library
in behind it, so no import order meets a half-initialised package. Errors and functions
then say they live here (``walsvc.WALFenced``).
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any, Final

# Loaded at once (it sits low: the backend interface and the model): it teaches
# ``unmarshal_message_id`` which id class a scheme has.
from walsvc.backends import _registry as _registry

if TYPE_CHECKING:
    from walsvc.apps._config import (
        WalConfig,
        load_config,
        open_node_from_config,
        open_wal_from_config,
    )
    from walsvc.backends._registry import known_schemes, register_backend
    from walsvc.core._api import Scanner
    from walsvc.core._chain import (
        AppendBatchNext,
        AppendNext,
        BatchInterceptor,
        ChainMember,
        ClosingInterceptor,
        CoalescingInterceptor,
        Interceptor,
        InterceptorContext,
        ManagesTransactions,
        PassesPlainMessages,
        PlainAdmission,
        ReadyInterceptor,
        StoppingInterceptor,
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
        Unauthenticated,
        UnknownBackend,
        UnknownTxn,
        UnsupportedVersion,
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
    from walsvc.remote._node_status import NodeLimits, NodeStatus
    from walsvc.remote._open import open_wal
    from walsvc.service._server import serve
    from walsvc.wal._api import WAL
    from walsvc.wal._wal import DEFAULT_MAX_MESSAGE_SIZE
    from walsvc.write._txn import Txn, TxnState

_EXPORTS: Final = (
    (
        "walsvc.apps._config",
        (
            "WalConfig",
            "load_config",
            "open_node_from_config",
            "open_wal_from_config",
        ),
    ),
    (
        "walsvc.backends._registry",
        (
            "known_schemes",
            "register_backend",
        ),
    ),
    (
        "walsvc.core._chain",
        (
            "AppendBatchNext",
            "AppendNext",
            "BatchInterceptor",
            "ChainMember",
            "ClosingInterceptor",
            "CoalescingInterceptor",
            "Interceptor",
            "InterceptorContext",
            "ManagesTransactions",
            "PassesPlainMessages",
            "PlainAdmission",
            "ReadyInterceptor",
            "StoppingInterceptor",
            "TxnKeyWindow",
        ),
    ),
    (
        "walsvc.core._codec",
        (
            "EnvelopeHeader",
            "peek",
        ),
    ),
    (
        "walsvc.core._deliver",
        (
            "Checkpoint",
            "DeliverPolicy",
        ),
    ),
    (
        "walsvc.core._errors",
        (
            "AppendOutcomeUnknown",
            "BackendUnavailable",
            "CorruptRecord",
            "InvalidArgument",
            "InvalidMessage",
            "MessageTooLarge",
            "RoutingMismatch",
            "SubscriptionBusy",
            "SubscriptionMismatch",
            "TxnAborted",
            "TxnBufferFull",
            "TxnError",
            "TxnExpired",
            "TxnNotActive",
            "Unauthenticated",
            "UnknownBackend",
            "UnknownTxn",
            "UnsupportedVersion",
            "WALClosed",
            "WALError",
            "WALFenced",
            "WALReadOnly",
            "WALTruncated",
        ),
    ),
    ("walsvc.core._filter", ("Filter",)),
    (
        "walsvc.core._ids",
        (
            "MessageId",
            "SequenceMessageId",
            "unmarshal_message_id",
        ),
    ),
    (
        "walsvc.core._message",
        (
            "APPLICATION_TYPES",
            "EXCLUSIVE_TYPES",
            "SYSTEM_TYPES",
            "AppendResult",
            "ImmutableMessage",
            "Message",
            "MessageType",
            "TxnContext",
            "producer_key",
        ),
    ),
    (
        "walsvc.core._timetick",
        (
            "HybridClock",
            "TimetickAllocator",
        ),
    ),
    (
        "walsvc.node._node",
        (
            "Node",
            "open_node",
        ),
    ),
    (
        "walsvc.node._routing",
        (
            "Routing",
            "balanced_pins",
        ),
    ),
    ("walsvc.core._api", ("Scanner",)),
    (
        "walsvc.remote._node_status",
        (
            "NodeLimits",
            "NodeStatus",
        ),
    ),
    ("walsvc.remote._open", ("open_wal",)),
    ("walsvc.service._server", ("serve",)),
    ("walsvc.wal._api", ("WAL",)),
    ("walsvc.wal._wal", ("DEFAULT_MAX_MESSAGE_SIZE",)),
    (
        "walsvc.write._txn",
        (
            "Txn",
            "TxnState",
        ),
    ),
)

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
    "CoalescingInterceptor",
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
    "ManagesTransactions",
    "Message",
    "MessageId",
    "MessageTooLarge",
    "MessageType",
    "Node",
    "NodeLimits",
    "NodeStatus",
    "PassesPlainMessages",
    "PlainAdmission",
    "ReadyInterceptor",
    "Routing",
    "RoutingMismatch",
    "Scanner",
    "SequenceMessageId",
    "StoppingInterceptor",
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
    "Unauthenticated",
    "UnknownBackend",
    "UnknownTxn",
    "UnsupportedVersion",
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
    "serve",
    "unmarshal_message_id",
)


def __getattr__(name: str) -> Any:
    if name not in _ORIGINS:
        raise AttributeError(f"module 'walsvc' has no attribute {name!r}")
    _load()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


#: Where each public name is defined.
_ORIGINS: Final = {name: module for module, names in _EXPORTS for name in names}


def _load() -> None:
    """Import every public name into this module, and make errors and functions say they
    live here (classes with annotations keep their module: typing and msgspec resolve
    those in it)."""
    namespace = globals()
    for module_name, names in _EXPORTS:
        module = importlib.import_module(module_name)
        for name in names:
            value = getattr(module, name)
            if (isinstance(value, type) and issubclass(value, BaseException)) or isinstance(
                value, types.FunctionType
            ):
                value.__module__ = __name__
            namespace[name] = value
