"""``NodeScanner``: one vchannel of a ``walsvc.Node``, read stretch after stretch across
routing versions (the pchannel it was routed to under each version, up to the next
version's cut, then the live pchannel)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Final, final

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, unmarshal_message_id
from walsvc.core._message import ImmutableMessage, MessageType
from walsvc.read._scanner import Scanner
from walsvc.wal._api import WAL

from ._routing import Cut, Stretch

__all__ = ("NodeScanner",)

_ALL: Final = DeliverPolicy.all()
_TIME_TICK: Final = MessageType.TIME_TICK


@final
class NodeScanner:
    """One vchannel's messages from ``Node.read``, stretch after stretch, as an async
    iterator and async context manager; otherwise like ``walsvc.Scanner``: iteration waits
    at the end of the live pchannel, ends after ``aclose()``, and raises ``WALClosed`` if
    the node closes underneath it. TimeTicks (``timeticks=True``) come only from the live
    pchannel, as does a subscription's stream."""

    __slots__ = (
        "_chosen",
        "_closed",
        "_deliver",
        "_end",
        "_index",
        "_open_reader",
        "_plan",
        "_scanner",
        "_subscription",
        "_timeticks",
    )

    def __init__(
        self,
        wals: Mapping[str, WAL],
        open_reader: Callable[[str], Awaitable[WAL]],
        vchannel: str,
        deliver: DeliverPolicy,
        chosen: Filter,
        plan: Sequence[Stretch],
        *,
        timeticks: bool = False,
        subscription: str | None = None,
    ) -> None:
        self._open_reader = open_reader
        self._timeticks = timeticks
        self._subscription = subscription
        self._deliver = deliver
        self._chosen = Filter(vchannels=[vchannel]) & chosen  # the exact test
        self._plan = plan
        self._index = 0
        self._scanner: Scanner | None = None
        self._end: tuple[MessageId, Cut] | None = None  # (id, cut) of a closed stretch
        self._closed = False
        own = wals.get(plan[0].pchannel)
        if own is not None:  # start now: DeliverPolicy.latest() means "from now"
            self._start(own)

    def __aiter__(self) -> NodeScanner:
        return self

    async def __anext__(self) -> ImmutableMessage:
        while True:
            scanner = self._scanner or await self._open()
            if self._end is None:
                return await scanner.__anext__()
            message = await scanner.__anext__()
            keep, done = self._clip(message)
            if done:
                await self._next_stretch()
            if keep:
                return message

    async def batches(self) -> AsyncIterator[Sequence[ImmutableMessage]]:
        """Iterate in batches (each non-empty) instead of one message at a time."""
        while True:
            try:
                scanner = self._scanner or await self._open()
            except StopAsyncIteration:  # closed
                return
            batches = scanner.batches()
            try:
                async for batch in batches:
                    if self._end is None:
                        yield batch
                        continue
                    kept, done = self._clip_batch(batch)
                    if kept:
                        yield kept
                    if done:
                        break
                else:
                    return  # closed
            finally:
                if isinstance(batches, AsyncGenerator):
                    await batches.aclose()
            await self._next_stretch()

    def _clip_batch(self, batch: Sequence[ImmutableMessage]) -> tuple[list[ImmutableMessage], bool]:
        kept = []
        for message in batch:
            keep, done = self._clip(message)
            if keep:
                kept.append(message)
            if done:
                return kept, True
        return kept, False

    def _clip(self, message: ImmutableMessage) -> tuple[bool, bool]:
        """(deliver it, the closed stretch is done) for a message of a closed stretch."""
        assert self._end is not None
        end, cut = self._end
        if not message.persisted:  # an idle tick: past the cut once its tick is
            return False, message.timetick > cut.timetick
        if message.message_id > end:
            return False, True
        if message.type is _TIME_TICK:  # read only to see the stretch end: the cut may be one
            return False, message.message_id == end
        return self._chosen.admits(message), message.message_id == end

    async def _open(self) -> Scanner:
        scanner = self._scanner
        while scanner is None:
            if self._closed:
                raise StopAsyncIteration
            wal = await self._open_reader(self._plan[self._index].pchannel)
            if self._closed:
                raise StopAsyncIteration
            scanner = self._start(wal)
        return scanner

    def _start(self, wal: WAL) -> Scanner | None:
        """Open the current stretch's scanner on ``wal``; None if the timetick floor
        rejects the whole stretch, which is then skipped."""
        _, after, until = self._plan[self._index]
        start = None if after is None else unmarshal_message_id(after)
        deliver = _ALL if start is None else DeliverPolicy.start_after(start)
        floor = self._chosen.min_timetick
        if until is None:  # the live stretch
            self._end = None
            if self._deliver.kind != "all":
                deliver = self._deliver
            self._scanner = wal.read(
                deliver,
                [self._chosen],
                timeticks=self._timeticks,
                subscription=self._subscription,
            )
        elif until.message_id is not None and floor <= until.timetick:
            # Admit the cut message too, so the stretch is seen to end.
            vchannels = [*(self._chosen.vchannels or ()), until.vchannel]
            self._end = (unmarshal_message_id(until.message_id), until)
            ends = [Filter(vchannels=vchannels, min_timetick=floor)]
            self._scanner = wal.read(deliver, ends, timeticks=True)
        else:  # every message of the stretch is below the timetick floor
            self._index += 1
        return self._scanner

    async def _next_stretch(self) -> None:
        scanner, self._scanner = self._scanner, None
        self._index += 1
        if scanner is not None:
            await scanner.aclose()

    async def ack(self, message: ImmutableMessage) -> None:
        """Acknowledge ``message`` for the subscription (see ``Scanner.ack``; a node
        scanner with a subscription reads the live pchannel only)."""
        scanner = self._scanner or await self._open()
        await scanner.ack(message)

    async def flush(self) -> None:
        """Write the subscription's latest acknowledged checkpoint now."""
        if self._scanner is not None:
            await self._scanner.flush()

    async def aclose(self) -> None:
        """Stop the scanner; iteration then ends. Idempotent."""
        self._closed = True
        scanner, self._scanner = self._scanner, None
        if scanner is not None:
            await scanner.aclose()

    async def __aenter__(self) -> NodeScanner:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
