"""Before a reconnecting client sends its unanswered appends again, it asks the node
what became of them (``Recall``, protocol version 3).

Each append waiting in the book was sent with idempotency keys (producer keys, or the
user's), and after the connection had seen an answer with some timetick (``Pending.since``):
if it landed, it landed later. The node answers per key from its dedup window, or, where
the window has dropped keys since then, from the log (``LocalWAL.recall_keys``). An
append whose every key landed is answered from that and not sent again; the rest are
sent again as before, and the window (which now holds every key found) answers any
that landed. So an append lands once however many keys the window dropped while its
answer was lost, where over version 2 that held only while the window still had it.

A node that cannot tell (the log there is damaged or truncated) fails those appends
``AppendOutcomeUnknown``; one whose chain keeps no keys (``InvalidArgument``) has them
sent again as before. Any other failure (the socket lost again, the node draining)
fails the restore, and the next socket tries again.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Final

import msgspec

from walsvc.core._errors import AppendOutcomeUnknown, CorruptRecord, InvalidArgument

from ._client_messages import Append, AppendMany, ClientMessage, Recall
from ._node_messages import Appended, Recalled
from ._pending import Pending

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ("RECALL_KEYS", "recall")

_decode: Final = msgspec.msgpack.Decoder(ClientMessage).decode
#: The most keys one ``Recall`` asks about, unless one ``AppendMany`` alone has more (it
#: goes in a ``Recall`` of its own): a frame of them stays well under a MiB.
RECALL_KEYS: Final = 8192


async def recall(conn: Connection, handle: int) -> None:
    """Ask the node of ``conn``'s new socket (the WAL open as ``handle``) about every
    keyed append on the book that was sent before; answer those that landed, fail
    those it cannot tell about, and leave the rest to be sent again."""
    asked: list[tuple[int, Pending, list[tuple[str, str]]]] = []
    for request, pending in list(conn._pending.items()):
        if not pending.append or not pending.sent or pending.future.done():
            continue  # never sent (it cannot have landed), or not an append
        item = pending.item
        if isinstance(item, bytes):
            item = pending.item = _decode(item)
        if type(item) is Append:
            messages = [item.message]
        elif type(item) is AppendMany:
            messages = item.messages
        else:
            continue
        keys = [(m.vchannel, m.idempotency_key) for m in messages if m.idempotency_key]
        if len(keys) == len(messages):  # else it is not sent again at all
            asked.append((request, pending, keys))
    chunks: list[list[tuple[int, Pending, list[tuple[str, str]]]]] = []
    size = RECALL_KEYS
    for entry in asked:  # consecutive appends together: their ``since`` are close
        if size + len(entry[2]) > RECALL_KEYS:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry[2])
    for chunk in chunks:
        request = conn.next_id()
        since = min(pending.since for _, pending, _ in chunk)
        keys = [key for _, _, keys in chunk for key in keys]
        try:
            answer: Recalled = await conn.direct(Recall(request, handle, since, keys), request)
        except InvalidArgument:
            return  # the node's chain keeps no keys: everything is sent again as before
        except AppendOutcomeUnknown as exc:
            for asked_request, pending, _ in chunk:
                conn._answered(asked_request)
                if pending.future.done():
                    continue  # given up on (cancelled) meanwhile
                pending.future.set_exception(
                    AppendOutcomeUnknown(
                        f"the answer to the append was lost with the connection to"
                        f" {conn.where}, and the node cannot tell whether it landed: {exc}"
                    )
                )
            continue
        if len(answer.results) != len(keys):
            raise CorruptRecord(
                f"the node at {conn.where} answered {len(answer.results)} results to a"
                f" Recall of {len(keys)} keys"
            )
        results = iter(answer.results)
        for asked_request, pending, its_keys in chunk:
            found = [r for r in itertools.islice(results, len(its_keys)) if r is not None]
            if len(found) == len(its_keys) and not pending.future.done():
                conn._answered(asked_request)
                pending.future.set_result(Appended(asked_request, found))
