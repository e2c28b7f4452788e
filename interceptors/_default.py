"""``default_chain``: the interceptors ``open_wal`` runs when given none."""

from __future__ import annotations

from walsvc.core._chain import ChainMember

from ._dedup import Dedup
from ._exclusive import ExclusiveLock
from ._redo import Redo
from ._timetick import DEFAULT_SYNC_INTERVAL, TimetickSync
from ._txn import Transactions

__all__ = ("default_chain",)


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
