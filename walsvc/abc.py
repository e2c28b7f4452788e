"""The implementers' door: everything needed to write a backend, a subscription store, an
interceptor or a scanner stage of one's own, with public names only.

Users import ``walsvc``; implementers import this module too. A backend subclasses
``Backend`` (and ``BackendScanner``), stores the opaque envelopes the WAL hands it, and
reads them back with the envelope codec (``decode``, ``decode_run``, ``timetick_of``);
it registers with ``walsvc.register_backend`` or the ``walsvc.backends`` entry-point
group, and ``walsvc.testing.check_backend`` proves it. Its durable subscriptions are a
``SubscriptionStore`` writing ``encode_subscription``'s stored form: it overrides the
hooks ``_load``, ``_save``, ``_delete`` and ``_names`` (and, to claim names across
processes, ``_lock``/``_unlock``), which the public ``load``, ``save``, ``delete``,
``names``, ``claim`` and ``release`` call after checking their arguments. A backend that
decodes records on the event loop takes its steps under ``turn()``, the per-loop read
budget (``STEP`` units a step, ``DECODE_COST`` a decoded record). An interceptor
implements ``Interceptor`` and any of the optional capabilities (``BatchInterceptor``,
``ReadyInterceptor``, ``ClosingInterceptor``, ``StoppingInterceptor``, ``PlainAdmission``,
``CoalescingInterceptor``, ``PassesPlainMessages``, ``ManagesTransactions``) against the
``InterceptorContext`` its WAL gives it. ARCHITECTURE.md ("Extension points") says what
each promises.
"""

from __future__ import annotations

from walsvc.backends._base import Backend, BackendScanner, EnvelopeRun, RunScanner
from walsvc.backends._memory import MemorySubscriptionStore
from walsvc.backends._subscriptions import (
    MAX_CHECKPOINT_BYTES,
    StoredSubscription,
    SubscriptionScope,
    SubscriptionStore,
    check_subscription_name,
    decode_subscription,
    encode_subscription,
)
from walsvc.core._budget import DECODE_COST, STEP, ReadBudget, turn
from walsvc.core._chain import (
    AppendBatchNext,
    AppendNext,
    BatchInterceptor,
    ChainMember,
    ClosingInterceptor,
    CoalescingInterceptor,
    Interceptor,
    InterceptorContext,
    KeyRecall,
    ManagesTransactions,
    PassesPlainMessages,
    PlainAdmission,
    ReadyInterceptor,
    StoppingInterceptor,
    TxnKeyWindow,
    is_plain,
)
from walsvc.core._codec import (
    HEADER_SIZE,
    EnvelopeHeader,
    decode,
    peek,
    timetick_of,
)
from walsvc.core._encode import encode
from walsvc.core._ids import MessageId, SequenceMessageId
from walsvc.core._runs import decode_run

__all__ = (
    "DECODE_COST",
    "HEADER_SIZE",
    "MAX_CHECKPOINT_BYTES",
    "STEP",
    "AppendBatchNext",
    "AppendNext",
    "Backend",
    "BackendScanner",
    "BatchInterceptor",
    "ChainMember",
    "ClosingInterceptor",
    "CoalescingInterceptor",
    "EnvelopeHeader",
    "EnvelopeRun",
    "Interceptor",
    "InterceptorContext",
    "KeyRecall",
    "ManagesTransactions",
    "MemorySubscriptionStore",
    "MessageId",
    "PassesPlainMessages",
    "PlainAdmission",
    "ReadBudget",
    "ReadyInterceptor",
    "RunScanner",
    "SequenceMessageId",
    "StoppingInterceptor",
    "StoredSubscription",
    "SubscriptionScope",
    "SubscriptionStore",
    "TxnKeyWindow",
    "check_subscription_name",
    "decode",
    "decode_run",
    "decode_subscription",
    "encode",
    "encode_subscription",
    "is_plain",
    "peek",
    "timetick_of",
    "turn",
)
