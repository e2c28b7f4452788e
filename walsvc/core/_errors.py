"""The walsvc error tree: one root, flat, named for the state the WAL is in.

Backends translate their client library's exceptions into these at the backend boundary;
nothing above a backend ever sees a third-party exception type.
"""

from __future__ import annotations

__all__ = (
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
    "transient",
)


class WALError(Exception):
    """Root of every error walsvc raises on purpose.

    ``retriable`` says whether the same call may succeed if made again unchanged (after the
    cause goes away); callers and the redo machinery retry only retriable errors.
    """

    retriable: bool = False


class WALClosed(WALError):
    """The WAL or scanner was closed before or during the call."""


class WALFenced(WALError):
    """A newer writer opened this pchannel read-write; this instance can never write again."""


class WALReadOnly(WALError):
    """The WAL was opened read-only and the call would change the log."""


class WALTruncated(WALError):
    """The requested position lies in a part of the log that was truncated away."""


class CorruptRecord(WALError):
    """Stored or received bytes are not a valid record: checksum, framing, or version."""


class MessageTooLarge(WALError):
    """The encoded message exceeds the WAL's ``max_message_size``; nothing was written."""


class InvalidMessage(WALError):
    """The message is malformed (wrong field types, out-of-range type, oversized vchannel)."""


class InvalidArgument(WALError, ValueError):
    """An argument is malformed: a URL, a pchannel name, an option value."""


class BackendUnavailable(WALError):
    """The backend could not be reached or failed transiently, and nothing of the call was
    written; the call may be retried."""

    retriable = True


class AppendOutcomeUnknown(WALError):
    """The append was handed to the backend and then failed in a way that leaves open
    whether it was written (an I/O error mid-sync, a lost connection before the ack).

    Not retriable blindly: a retry could write a duplicate. Messages with an idempotency
    key are resolved by the dedup interceptor, which reads the log tail before answering.
    """


class TxnError(WALError):
    """Root of the transaction errors."""


class TxnExpired(TxnError):
    """The transaction outlived its keepalive (measured in timeticks) and was rolled back."""


class TxnAborted(TxnError):
    """The transaction was rolled back by the WAL: a body append failed, an exclusive (DDL)
    message on its vchannel was appended, or the WAL closed."""


class TxnNotActive(TxnError):
    """The transaction was already committed or rolled back (or is committing)."""


class UnknownTxn(TxnError):
    """The message names a transaction this WAL does not know (another WAL's, or one from
    before a restart)."""


class UnknownBackend(WALError):
    """No backend is registered for the URL scheme, or its optional extra is not installed."""


class Unauthenticated(WALError):
    """A walsvc node refused the connection: the client presented no bearer token, or
    not the node's."""


class UnsupportedVersion(WALError):
    """A walsvc node and this client share no protocol version; the message names both
    ranges."""


class TxnBufferFull(WALError):
    """A scanner's transaction buffer would exceed its limit: the open transactions it
    holds have more body bytes than ``WAL.read(txn_buffer_bytes=...)`` allows. Nothing was
    delivered out of order or dropped; reopen the scanner with a larger limit."""


class SubscriptionBusy(WALError):
    """Another scanner of this process already reads with the same subscription name."""


class SubscriptionMismatch(InvalidArgument):
    """A scanner asked for a durable subscription with other vchannels or types than the
    subscription was stored with: its checkpoint is a position among the messages of its
    own filter, so reading another set from it would skip or repeat messages."""


class RoutingMismatch(InvalidArgument):
    """The pchannels given to ``open_node`` differ from the routing stored with the log;
    changing the routing is an explicit migration (``open_node(..., migrate=True)``)."""


def transient(error: BaseException | None) -> bool:
    """True if ``error`` says the backend failed for now: a retriable error, or an append
    whose outcome is unknown. A call that may be made twice harmlessly (a read, a
    TimeTick, a second rollback of a transaction) may succeed if made again; an append
    of a user's message without a key may not be repeated after ``AppendOutcomeUnknown``."""
    return isinstance(error, AppendOutcomeUnknown) or (
        isinstance(error, WALError) and error.retriable
    )


# Public through the ``walsvc`` facade: tracebacks and reprs name them there
# (``walsvc.WALFenced``) wherever they are raised, also in processes that never touched
# the facade's names (Spark's workers). Pickle finds them there too.
for _name in __all__:
    if isinstance(globals()[_name], type):
        globals()[_name].__module__ = "walsvc"
del _name
