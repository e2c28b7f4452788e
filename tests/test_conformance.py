"""The conformance kit on every backend, and proof that the kit fails broken backends."""

from __future__ import annotations

import asyncio
import sys
import types
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import scanners
import walsvc
from walsvc import DeliverPolicy, Filter, ImmutableMessage, MessageId
from walsvc.backends import Backend, BackendScanner
from walsvc.backends._memory import MemoryBackend, MemoryMessageId
from walsvc.backends._subscriptions import SubscriptionStore
from walsvc.testing import check_backend, check_truncation, memory_wal

Opener = Callable[..., Awaitable[walsvc.WAL]]


def opener(url: str, **options: Any) -> Opener:
    def open_wal_for(pchannel: str, *, read_only: bool) -> Awaitable[walsvc.WAL]:
        return walsvc.open_wal(url, pchannel, read_only=read_only, **options)

    return open_wal_for


async def test_memory_backend() -> None:
    await check_backend(opener(f"memory://{uuid.uuid4().hex}"))


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="default"),
        pytest.param({"sync": "none"}, id="sync-none"),
        pytest.param({"segment_size": 64 * 1024}, id="small-segments"),
    ],
)
async def test_file_backend(tmp_path: Path, options: dict[str, Any]) -> None:
    await check_backend(opener(f"file://{tmp_path}", **options), message_count=500)


async def test_file_backend_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    await check_backend(opener("file://walsvc-data"), message_count=50, pchannels=1)
    assert (tmp_path / "walsvc-data").is_dir()


async def test_memory_wal_is_private_and_writable() -> None:
    async with await memory_wal() as first, await memory_wal() as second:
        sent = await first.append(walsvc.Message(payload=b"x", vchannel="v1"))
        assert not first.read_only
        assert first.pchannel == "pchannel-0"
        assert await second.latest_message_id() == MemoryMessageId(0)  # its opening TimeTick
        insert = [scanners.types(walsvc.MessageType.INSERT)]
        async with first.read(filters=insert, timeticks=True) as scanner:
            opening = await anext(scanner)  # system messages pass type filters
            message = await anext(scanner)
        assert opening.type is walsvc.MessageType.TIME_TICK
        assert message.message_id == sent.message_id
        async with first.read(filters=insert) as scanner:
            message = await anext(scanner)  # by default, no TimeTicks
        assert message.payload == b"x"


async def test_memory_wal_passes_options() -> None:
    async with await memory_wal("other", max_message_size=100) as wal:
        assert wal.pchannel == "other"
        with pytest.raises(walsvc.MessageTooLarge):
            await wal.append(walsvc.Message(payload=bytes(200), vchannel="v"))
    with pytest.raises(TypeError, match="unknown option"):
        await memory_wal(no_such_option=1)


async def test_check_backend_rejects_bad_arguments() -> None:
    with pytest.raises(walsvc.InvalidArgument, match="message_count"):
        await check_backend(opener("memory://x"), message_count=1)
    with pytest.raises(walsvc.InvalidArgument, match="pchannels"):
        await check_backend(opener("memory://x"), pchannels=0)


# ---------------------------------------------------------------------------------------
# A deliberately broken backend: the memory backend with one fault, chosen by the URL
# (``brokenmem://FAULT/NAME``). The kit must fail each fault with an AssertionError that
# says what differed.

_SCHEME = "brokenmem"
_MODULE = "_walsvc_test_broken_backend"


class _BrokenScanner(BackendScanner):
    def __init__(self, inner: BackendScanner, fault: str) -> None:
        self._inner = inner
        self._fault = fault
        self._seen = 0

    async def next_batch(self) -> Sequence[ImmutableMessage]:
        if self._fault == "stall":
            await asyncio.Event().wait()
        while True:
            batch = list(await self._inner.next_batch())
            start = self._seen
            self._seen += len(batch)
            if self._fault == "drop":
                # Lose the 8th message of the stream.
                if start <= 7 < self._seen:
                    del batch[7 - start]
            elif self._fault == "reorder" and len(batch) >= 2:
                batch[0], batch[1] = batch[1], batch[0]
            elif self._fault == "duplicate" and start <= 3 < self._seen:
                batch.insert(3 - start, batch[3 - start])
            elif self._fault == "corrupt" and start <= 5 < self._seen:
                bad = batch[5 - start]
                batch[5 - start] = ImmutableMessage(
                    bad.message_id,
                    bad.timetick,
                    bad.vchannel,
                    bad.type,
                    bad.payload + b"!",
                    bad.properties,
                    bad.last_confirmed_id,
                    bad.txn,
                    bad.idempotency_key,
                    bad.term,
                )
            if batch:
                return batch

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BrokenBackend(Backend):
    scheme = _SCHEME
    message_id_class = MemoryMessageId

    def __init__(self, inner: MemoryBackend, fault: str, read_only: bool) -> None:
        self._inner = inner
        self._fault = fault
        self.pchannel = inner.pchannel
        self.term = inner.term
        # "ro-writable": claims to be writable when opened read-only.
        self.read_only = read_only and fault != "ro-writable"

    @classmethod
    async def open(
        cls,
        location: str,
        pchannel: str,
        *,
        read_only: bool,
        options: Mapping[str, Any],
        max_message_size: int,
    ) -> Backend:
        fault, _, name = location.partition("/")
        inner = await MemoryBackend.open(
            name, pchannel, read_only=read_only, options=options, max_message_size=max_message_size
        )
        return cls(inner, fault, read_only)

    def append(self, records: Sequence[bytes]) -> Awaitable[Sequence[MessageId]]:
        if self._fault == "no-fencing":
            self._inner._log.term = self._inner.term  # take the log back from newer writers
        return self._inner.append(records)

    def read(self, deliver: DeliverPolicy, selected: Filter) -> BackendScanner:
        if self._fault == "latest-is-all" and deliver.kind == "latest":
            deliver = DeliverPolicy.all()
        if self._fault == "start-after-inclusive" and deliver.kind == "start_after":
            assert deliver.message_id is not None
            deliver = DeliverPolicy.start_from(deliver.message_id)
        return _BrokenScanner(self._inner.read(deliver, selected), self._fault)

    async def latest_message_id(self) -> MessageId | None:
        return await self._inner.latest_message_id()

    async def last_timetick(self) -> int:
        return await self._inner.last_timetick()

    async def truncate(self, message_id: MessageId) -> None:
        if self._fault != "truncate-is-noop":
            await self._inner.truncate(message_id)
        elif self._inner._log.term != self.term:
            raise walsvc.WALFenced("fenced")  # only the truncation itself is broken

    async def aclose(self) -> None:
        await self._inner.aclose()

    def subscriptions(self) -> SubscriptionStore:
        return self._inner.subscriptions()


def _register_broken_backend() -> None:
    module = types.ModuleType(_MODULE)
    module.backend_class = _BrokenBackend  # type: ignore[attr-defined]
    sys.modules[_MODULE] = module
    if _SCHEME not in walsvc.known_schemes():
        walsvc.register_backend(_SCHEME, _MODULE)


_register_broken_backend()


@pytest.mark.parametrize(
    ("fault", "complaint"),
    [
        ("drop", r"first difference at index 6: expected id MemoryMessageId\(7\)"),
        ("reorder", "ids not strictly increasing"),
        ("duplicate", "ids not strictly increasing"),
        ("corrupt", "payload of .* bytes != .* bytes written, first difference at byte"),
        # The backlog arrives first, or an idle TimeTick does (the WAL believes a latest()
        # scanner has caught up) and then the backlog's older ticks: either is caught.
        (
            "latest-is-all",
            "although nothing was appended after the scanner was created"
            "|does not advance the timetick beyond .*: log order must equal timetick order",
        ),
        ("start-after-inclusive", r"start_after.*first difference at index 0"),
        ("ro-writable", "opened read-only, the WAL says read_only=False"),
        ("no-fencing", "append by a fenced writer succeeded; expected walsvc.WALFenced"),
        ("truncate-is-noop", "at or before the truncation point"),
    ],
)
async def test_check_backend_fails_a_broken_backend(fault: str, complaint: str) -> None:
    with pytest.raises(AssertionError, match=complaint):
        await check_backend(
            opener(f"{_SCHEME}://{fault}/{uuid.uuid4().hex}"), message_count=40, pchannels=2
        )


async def test_the_truncation_step_runs_alone_and_can_be_left_out() -> None:
    broken = opener(f"{_SCHEME}://truncate-is-noop/{uuid.uuid4().hex}")
    with pytest.raises(AssertionError, match="at or before the truncation point"):
        await check_truncation(broken)
    await check_truncation(opener(f"memory://{uuid.uuid4().hex}"))
    await check_backend(broken, message_count=40, pchannels=1, truncation=False)


async def test_check_backend_fails_a_hang() -> None:
    """A scanner that never delivers fails the kit (after ``hang_after``), not hangs it.

    The stalled scanners also stall the interceptors' reads of the log on open (dedup
    rebuild, transaction recovery), so the appends hang as well: whichever of the two
    watchdogs fires first is reported.
    """
    with pytest.raises(
        AssertionError,
        match=r"still waiting for a message after 0\.3 s, 0 delivered"
        r"|appending did not finish within 0\.3 s",
    ):
        await check_backend(
            opener(f"{_SCHEME}://stall/{uuid.uuid4().hex}"),
            message_count=5,
            pchannels=1,
            hang_after=0.3,
        )
