"""The exactly-once step of ``check_backend``: what idempotency keys promise on a backend.

On one fresh pchannel, through the default interceptor chain:

1. Keyed appends cancelled at different points and retried at once: the retry returns
   what the cancelled append got if it landed, and every later retry the same.
2. A keyed batch (``append_many``) retried, whole and mixed with new keys.
3. A keyed transaction committed, then retried: a replay that appends nothing.
4. After a reopen (a restarted producer): every retry is answered from the rebuilt
   window, the transaction replays, and nothing is appended (but TimeTicks: a WAL a
   node keeps open across its clients' reopens persists its ticks when its timer says).
5. The log holds each key once, at the id every answer named.
6. ``Backend.start_at_timetick``: reading from its answer includes every message at or
   above the tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, NoReturn, final

from walsvc.core._deliver import DeliverPolicy
from walsvc.core._ids import MessageId
from walsvc.core._message import AppendResult, ImmutableMessage, Message, MessageType
from walsvc.wal._api import WAL
from walsvc.wal._wal import LocalWAL

__all__ = ("ExactlyOnceCheck",)

_KEYS: Final = 24
_VCHANNEL: Final = "eo"


@final
class ExactlyOnceCheck:
    """The step on pchannel ``pchannel`` of the log behind ``opener`` (see the module)."""

    def __init__(
        self, opener: Callable[..., Awaitable[WAL]], pchannel: str, timeout: float
    ) -> None:
        self._opener = opener
        self.pchannel = pchannel
        self.timeout = timeout
        self.answers: dict[str, AppendResult] = {}

    def fail(self, text: str) -> NoReturn:
        raise AssertionError(f"pchannel {self.pchannel!r}, exactly-once: {text}")

    @contextlib.asynccontextmanager
    async def _writer(self) -> AsyncIterator[WAL]:
        async with asyncio.timeout(self.timeout):
            wal = await self._opener(self.pchannel, read_only=False)
        try:
            yield wal
        finally:
            await wal.aclose()

    async def run(self) -> None:
        async with self._writer() as wal, asyncio.timeout(self.timeout * 4):
            await self._cancelled_and_retried(wal)
            await self._batches(wal)
            commit = await self._transaction(wal, expect_replay=False)
        async with self._writer() as wal, asyncio.timeout(self.timeout * 4):
            await wal.wait_ready()
            before = await wal.latest_message_id()
            for key, answer in self.answers.items():
                again = await wal.append(_message(key))
                if again != answer:
                    self.fail(f"after a reopen, key {key!r} got {again}, first {answer}")
            if await self._transaction(wal, expect_replay=True) != commit:
                self.fail("the replayed transaction answered with another commit")
            appended = await self._appended_since(wal, before)
            if appended:
                self.fail(f"retries after a reopen appended to the log: {appended}")
            await self._check_log(wal)
            await self._check_start_at_timetick(wal)

    async def _appended_since(self, wal: WAL, before: MessageId | None) -> list[str]:
        """The messages after ``before`` that are not TimeTicks, described."""
        latest = await wal.latest_message_id()
        if latest == before:
            return []
        policy = DeliverPolicy.all() if before is None else DeliverPolicy.start_after(before)
        found: list[str] = []
        async with wal.read(policy, raw=True, timeticks=True) as scanner:
            async for message in scanner:
                if message.type is not MessageType.TIME_TICK:
                    found.append(f"{message.type.name} {message.idempotency_key!r}")
                if message.message_id == latest:
                    return found
        return found

    async def _cancelled_and_retried(self, wal: WAL) -> None:
        for i in range(_KEYS):
            key = f"m{i}"
            first = asyncio.ensure_future(wal.append(_message(key)))
            for _ in range(i % 5):
                await asyncio.sleep(0)
            first.cancel()
            answer = await wal.append(_message(key))
            if await wal.append(_message(key)) != answer:
                self.fail(f"two retries of key {key!r} got different answers")
            await asyncio.gather(first, return_exceptions=True)
            if not first.cancelled() and first.exception() is None and first.result() != answer:
                self.fail(f"key {key!r}: the retry got {answer}, the append {first.result()}")
            self.answers[key] = answer

    async def _batches(self, wal: WAL) -> None:
        keys = [f"b{i}" for i in range(6)]
        first = await wal.append_many([_message(k) for k in keys[:4]])
        mixed = await wal.append_many([_message(k) for k in keys])
        if mixed[:4] != first:
            self.fail(f"a retried batch got {mixed[:4]}, first {first}")
        self.answers.update(zip(keys, mixed, strict=True))

    async def _transaction(self, wal: WAL, *, expect_replay: bool) -> AppendResult | None:
        async with wal.txn(_VCHANNEL, idempotency_key="t") as txn:
            bodies = [Message(payload=b"body%d" % i, vchannel=_VCHANNEL) for i in range(3)]
            await txn.append_many(bodies)
        if txn.replayed != expect_replay:
            self.fail(f"a transaction retried with its key replayed={txn.replayed}")
        return txn.commit_result

    async def _check_log(self, wal: WAL) -> None:
        log = await _raw_log(wal)
        keyed = Counter(m.idempotency_key for m in log if m.idempotency_key and m.txn is None)
        twice = sorted(k for k, n in keyed.items() if n > 1)
        if twice:
            self.fail(f"keys stored more than once: {twice}")
        where = {m.idempotency_key: m.message_id for m in log if m.txn is None}
        for key, answer in self.answers.items():
            if where.get(key) != answer.message_id:
                self.fail(f"key {key!r} answered {answer.message_id}, stored {where.get(key)}")
        commits = [m for m in log if m.type is MessageType.COMMIT_TXN and m.idempotency_key]
        if len(commits) != 1:
            self.fail(f"the keyed transaction committed {len(commits)} times")

    async def _check_start_at_timetick(self, wal: WAL) -> None:
        if not isinstance(wal, LocalWAL):
            return  # a backend's call: only a WAL in this process has one to check
        log = await _raw_log(wal)
        rng = random.Random(self.pchannel)
        for target in [0, log[-1].timetick + 1, *(rng.choice(log).timetick for _ in range(4))]:
            start = await wal.backend.start_at_timetick(target)
            read = [m.message_id for m in await _raw_log(wal, start) if m.timetick >= target]
            wanted = [m.message_id for m in log if m.timetick >= target]
            if read != wanted:
                self.fail(f"start_at_timetick({target}) -> {start} misses messages at the tick")


def _message(key: str) -> Message:
    return Message(payload=key.encode(), vchannel=_VCHANNEL, idempotency_key=key)


async def _raw_log(wal: WAL, start: DeliverPolicy | None = None) -> list[ImmutableMessage]:
    """The persisted log from ``start`` (default: all) to the newest message, as stored."""
    latest: MessageId | None = await wal.latest_message_id()
    out: list[ImmutableMessage] = []
    if latest is None:
        return out
    async with wal.read(start or DeliverPolicy.all(), raw=True, use_cache=False) as scanner:
        async for message in scanner:
            if message.persisted:
                out.append(message)
            if not message.message_id < latest:
                break
    return out
