"""Dedup: exactly-once appends for messages with an idempotency key.

Per (vchannel, key), within a window bounded by count and age:
- the first append of a key owns it and appends;
- a retry of a completed key gets the original ``AppendResult`` (id, tick, last-confirmed
  id) and appends nothing;
- concurrent retries wait for the owner, then get its result (or, if the owner failed
  without writing, one of them becomes the owner);
- an ambiguous failure (``AppendOutcomeUnknown``, cancellation after the hand-off) does
  not release the key: the log between the owner's last-confirmed id and its end is read
  first. Found: the append happened, and the caller gets its result. Not found: the key is
  released and the error raised. If the log cannot be read, the key stays blocked with
  ``AppendOutcomeUnknown`` until the WAL is reopened;
- on open, the window is rebuilt from the log (the messages younger than ``max_age``), so
  a retry after a crash or restart is still answered with the original result.
Milvus (PR #50007) loses its window on restart and releases keys on ambiguous errors.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Final, final

from walsvc import (
    AppendOutcomeUnknown,
    AppendResult,
    DeliverPolicy,
    Message,
    MessageId,
    WALError,
)
from walsvc._chain import AppendBatchNext, AppendNext, InterceptorContext
from walsvc._timetick import span_of_ms

from ._reading import read_through

__all__ = ("DEFAULT_MAX_AGE", "DEFAULT_MAX_KEYS", "Dedup")

#: Keys remembered per WAL (all vchannels together).
DEFAULT_MAX_KEYS: Final = 100_000
#: Seconds a completed key is remembered (by timetick, so across restarts too).
DEFAULT_MAX_AGE: Final = 600.0


@final
class _Entry:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.result: AppendResult | None = None
        self.error: WALError | None = None  # set while the key is blocked (unresolved)


@final
class Dedup:
    """The dedup interceptor (see the module docs). ``max_keys`` bounds memory;
    ``max_age`` (seconds, measured in timeticks) bounds how long a key is remembered and
    how much log the rebuild on open reads."""

    #: Messages without a key pass straight through (see ``walsvc._chain``).
    passes_plain_messages: Final = True

    __slots__ = ("_age_ticks", "_context", "_max_keys", "_window", "rebuilt")

    def __init__(
        self, *, max_keys: int = DEFAULT_MAX_KEYS, max_age: float = DEFAULT_MAX_AGE
    ) -> None:
        if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError(f"max_keys must be an int >= 1, not {max_keys!r}")
        if not (isinstance(max_age, int | float) and math.isfinite(max_age) and max_age > 0):
            raise ValueError(f"max_age must be seconds > 0, not {max_age!r}")
        self._max_keys = max_keys
        self._age_ticks = span_of_ms(round(max_age * 1000))
        self._context: InterceptorContext | None = None
        self._window: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        #: How many keys the rebuild on open recovered from the log.
        self.rebuilt = 0

    def __len__(self) -> int:
        """How many keys the window holds."""
        return len(self._window)

    async def ready(self, context: InterceptorContext) -> None:
        """Bind to the WAL and rebuild the window from the log."""
        if self._context is not None:
            raise RuntimeError("a Dedup interceptor serves one WAL")
        self._context = context
        newest = await context.last_durable_timetick()
        latest = await context.latest_message_id()
        if latest is None:
            return
        floor = max(0, newest - self._age_ticks)
        async for message in read_through(context, DeliverPolicy.all(), latest, floor):
            if message.idempotency_key is not None and message.txn is None:
                entry = _Entry()
                entry.result = AppendResult(
                    message.message_id, message.timetick, message.last_confirmed_id
                )
                entry.done.set_result(None)
                key = (message.vchannel, message.idempotency_key)
                self._window[key] = entry
                self._window.move_to_end(key)
                self.rebuilt += 1
        self._evict()

    def do_append(self, message: Message, call_next: AppendNext) -> Awaitable[AppendResult]:
        """Answer a retried key from the window; append a new one (messages without a
        key pass straight through)."""
        key = message.idempotency_key
        if key is None:
            return call_next(message)
        return self._keyed(message, (message.vchannel, key), call_next)

    def do_append_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> Awaitable[list[AppendResult]]:
        """A batch without keys passes through. A batch with keys is answered from the
        window where it can be, and the rest is appended as one batch; if a key of it is
        in flight in another append (or twice in the batch), it goes one at a time."""
        if all(m.idempotency_key is None for m in messages):
            return call_next(messages)
        return self._keyed_batch(messages, call_next)

    async def _keyed_batch(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        window = self._window
        keys = [
            None if m.idempotency_key is None else (m.vchannel, m.idempotency_key) for m in messages
        ]
        claimed = [k for k in keys if k is not None]
        if len(set(claimed)) != len(claimed) or any(
            (entry := window.get(k)) is not None and entry.result is None for k in claimed
        ):
            return await self._one_at_a_time(messages, call_next)
        results: list[AppendResult | None] = [
            None if k is None or k not in window else window[k].result for k in keys
        ]
        fresh = [i for i, r in enumerate(results) if r is None]
        if not fresh:
            return [r for r in results if r is not None]
        context = self._context
        assert context is not None, "appends wait for ready()"
        entries = {}
        for i in fresh:
            key = keys[i]
            if key is not None:
                entries[key] = window[key] = _Entry()
        floor = context.last_confirmed_id()  # at or before where the batch will land
        try:
            appended = await call_next([messages[i] for i in fresh])
        except AppendOutcomeUnknown as exc:
            # Each key is looked up in the log: found ones answer, the rest are released.
            found = {
                key: await self._resolve_or_none(key, entry, floor, exc)
                for key, entry in entries.items()
            }
            if len(found) < len(fresh) or any(r is None for r in found.values()):
                raise  # a retry appends what is missing and is answered for the rest
            appended = [r for r in found.values() if r is not None]  # fresh order
        except asyncio.CancelledError:
            for key, entry in entries.items():
                task = asyncio.ensure_future(self._resolve_quietly(key, entry, floor))
                task.add_done_callback(_collect)
            raise
        except BaseException:
            for key, entry in entries.items():
                self._release(key, entry)  # nothing was written
            raise
        for i, result in zip(fresh, appended, strict=True):
            results[i] = result
            key = keys[i]
            if key is not None and not entries[key].done.done():
                entries[key].result = result
                entries[key].done.set_result(None)
        self._evict()
        return [r for r in results if r is not None]

    async def _one_at_a_time(
        self, messages: Sequence[Message], call_next: AppendBatchNext
    ) -> list[AppendResult]:
        async def one(message: Message) -> AppendResult:
            (result,) = await call_next((message,))
            return result

        return [await self.do_append(m, one) for m in messages]

    async def _resolve_or_none(
        self,
        key: tuple[str, str],
        entry: _Entry,
        floor: MessageId | None,
        error: AppendOutcomeUnknown,
    ) -> AppendResult | None:
        """``_resolve`` for one key of an ambiguous batch: None if it was not found."""
        try:
            return await self._resolve(key, entry, floor, error)
        except AppendOutcomeUnknown as exc:
            if exc is error:
                return None
            raise

    async def _keyed(
        self, message: Message, key: tuple[str, str], call_next: AppendNext
    ) -> AppendResult:
        window = self._window
        while True:
            entry = window.get(key)
            if entry is None:
                break
            if entry.result is not None:
                return entry.result
            if entry.error is not None:
                raise AppendOutcomeUnknown(str(entry.error))
            await asyncio.shield(entry.done)
        context = self._context
        assert context is not None, "appends wait for ready()"
        entry = window[key] = _Entry()
        floor = context.last_confirmed_id()  # at or before where this message will land
        try:
            result = await call_next(message)
        except AppendOutcomeUnknown as exc:
            return await self._resolve(key, entry, floor, exc)
        except asyncio.CancelledError:
            # The message may be in flight; resolve in the background before releasing.
            task = asyncio.ensure_future(self._resolve_quietly(key, entry, floor))
            task.add_done_callback(_collect)
            raise
        except BaseException:
            self._release(key, entry)  # nothing was written
            raise
        entry.result = result
        entry.done.set_result(None)
        self._evict()
        return result

    async def _resolve(
        self,
        key: tuple[str, str],
        entry: _Entry,
        floor: MessageId | None,
        error: AppendOutcomeUnknown,
    ) -> AppendResult:
        """Find whether the ambiguous append landed; answer or release accordingly."""
        context = self._context
        assert context is not None
        try:
            found = await self._find(context, key, floor)
        except (WALError, OSError) as exc:
            entry.error = AppendOutcomeUnknown(
                f"{error}; and reading the log to resolve key {key[1]!r} failed ({exc!r}):"
                " the key stays blocked until the WAL is reopened"
            )
            if not entry.done.done():
                entry.done.set_result(None)
            raise entry.error from error
        if found is None:
            self._release(key, entry)
            raise error
        entry.result = found
        entry.done.set_result(None)
        return found

    async def _resolve_quietly(
        self, key: tuple[str, str], entry: _Entry, floor: MessageId | None
    ) -> None:
        try:
            await self._resolve(key, entry, floor, AppendOutcomeUnknown("the append was cancelled"))
        except WALError:
            pass

    async def _find(
        self, context: InterceptorContext, key: tuple[str, str], floor: MessageId | None
    ) -> AppendResult | None:
        latest = await context.latest_message_id()
        if latest is None or (floor is not None and latest < floor):
            return None
        start = DeliverPolicy.all() if floor is None else DeliverPolicy.start_from(floor)
        vchannel, idempotency_key = key
        async for message in read_through(context, start, latest, 0):
            if (
                message.idempotency_key == idempotency_key
                and message.vchannel == vchannel
                and message.txn is None
            ):
                return AppendResult(message.message_id, message.timetick, message.last_confirmed_id)
        return None

    def _release(self, key: tuple[str, str], entry: _Entry) -> None:
        if self._window.get(key) is entry:
            del self._window[key]
        if not entry.done.done():
            entry.done.set_result(None)

    def _evict(self) -> None:
        """Drop the oldest completed keys beyond ``max_keys`` or older than ``max_age``."""
        window = self._window
        context = self._context
        horizon = (context.last_tick() if context is not None else 0) - self._age_ticks
        while window:
            key, entry = next(iter(window.items()))
            if entry.result is None:
                break  # the oldest is in flight; the bound is met once it completes
            if len(window) > self._max_keys or entry.result.timetick < horizon:
                del window[key]
                continue
            break


def _collect(task: asyncio.Future[None]) -> None:
    """Mark a background task's outcome as seen."""
    if not task.cancelled():
        task.exception()
