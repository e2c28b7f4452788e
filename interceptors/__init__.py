"""The append interceptors of walsvc, one module per interceptor, and the default chain.

An interceptor implements ``walsvc.Interceptor`` (``do_append(message, call_next)``) and
optionally ``walsvc.BatchInterceptor``, ``walsvc.ReadyInterceptor`` and
``walsvc.ClosingInterceptor``. Pass a chain to ``walsvc.open_wal(..., interceptors=[...])``
(outermost first); ``default_chain()`` builds the one ``open_wal`` uses by default.
"""

from __future__ import annotations

from walsvc.core._chain import ChainMember

from ._dedup import DEFAULT_MAX_AGE, DEFAULT_MAX_KEYS, Dedup
from ._exclusive import ExclusiveLock
from ._redo import Redo
from ._timetick import DEFAULT_SYNC_INTERVAL, TimetickSync
from ._txn import Transactions

__all__ = (
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_KEYS",
    "DEFAULT_SYNC_INTERVAL",
    "Dedup",
    "ExclusiveLock",
    "Redo",
    "TimetickSync",
    "Transactions",
    "default_chain",
)


def default_chain(
    *,
    sync_interval: float | None = DEFAULT_SYNC_INTERVAL,
    dedup: Dedup | None = None,
    redo: Redo | None = None,
    retry: bool = True,
) -> list[ChainMember]:
    """A fresh default chain, outermost first: ``TimetickSync`` (no ``do_append``; first so
    its opening TimeTick precedes the other ``ready`` hooks), ``Dedup``, ``ExclusiveLock``
    (wired to roll back the vchannel's transactions), ``Transactions``, ``Redo``.

    ``sync_interval`` is the timetick sync period in seconds (None: no timer; drive it
    with ``TimetickSync.sync_once``); ``dedup``/``redo`` replace the default-configured
    ones. ``retry=False`` leaves ``Redo`` out: ``open_wal`` does so for a backend whose
    appends never fail retriably (``memory://``), where it would only cost each append a
    call.
    """
    if redo is not None and not retry:
        raise ValueError("a redo interceptor was given, but retry=False leaves it out")
    transactions = Transactions()
    chain: list[ChainMember] = [
        TimetickSync(sync_interval),
        dedup if dedup is not None else Dedup(),
        ExclusiveLock(transactions.abort_vchannel),
        transactions,
    ]
    if retry:
        chain.append(redo if redo is not None else Redo())
    return chain
