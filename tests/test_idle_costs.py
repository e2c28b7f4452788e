"""What an idle pchannel costs (issue 21, section 4): the shared timetick timer leaves a
quiet WAL alone until it wakes (an append, a tick listener, a scanner waiting for idle
ticks), and the file WAL's commit thread exits once it has waited ``COMMIT_THREAD_IDLE``
for a batch (the next batch starts another). Nothing here measures time: the tests wait
for events (ticks, threads gone), each bounded by a generous timeout."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _forks import reap

import walsvc
from interceptors import TimetickSync, default_chain
from walsvc import DeliverPolicy, Message, MessageType, WALClosed, WALFenced
from walsvc.backends._file import _ccommit
from walsvc.backends._file import _writer as writer_module
from walsvc.backends._file._workers import WORKER_THREADS
from walsvc.wal._context import WALContext

IDLE = 0.02  # seconds a commit thread waits for a batch here before it exits
LIMIT = 20  # seconds any wait here may take before the test fails (never reached)


def message(i: int) -> Message:
    return Message(payload=b"m%d" % i, vchannel=f"v{i % 3}")


def sync_of(wal: walsvc.WAL) -> TimetickSync:
    (sync,) = (m for m in wal.interceptors if isinstance(m, TimetickSync))
    return sync


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition()`` holds."""
    async with asyncio.timeout(LIMIT):
        while not condition():  # noqa: ASYNC110 (no event to wait on)
            await asyncio.sleep(0.005)


async def quiet(wals: list[walsvc.WAL]) -> None:
    """Wait until the timer has left every WAL of ``wals`` alone."""
    for wal in wals:
        await wal.wait_ready()
    await until(lambda: all(sync_of(w)._quiet for w in wals))


def commit_threads() -> int:
    count = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            count += (task / "comm").read_text().strip() == "walsvc-commit"
        except OSError:  # the thread exited meanwhile
            pass
    return count


def committer_of(wal: walsvc.WAL) -> Any:
    committer = wal.backend._writer._committer  # type: ignore[attr-defined]
    assert committer is not None
    return committer


@pytest.fixture
def short_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "COMMIT_THREAD_IDLE", IDLE)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """How often each WAL (by id) was asked ``data_tick`` or ``has_tick_listeners``: what
    the timer's visit asks."""
    asked: dict[int, int] = {}

    def counting(original: Callable[[WALContext], Any]) -> Callable[[WALContext], Any]:
        def ask(context: WALContext) -> Any:
            key = id(context._wal)
            asked[key] = asked.get(key, 0) + 1
            return original(context)

        return ask

    for name in ("data_tick", "has_tick_listeners"):
        monkeypatch.setattr(WALContext, name, counting(getattr(WALContext, name)))
    return asked


class Listener:
    """An interceptor that keeps the context, to add tick listeners later."""

    def __init__(self) -> None:
        self.context: walsvc.InterceptorContext | None = None
        self.ticks: list[int] = []

    async def ready(self, context: walsvc.InterceptorContext) -> None:
        self.context = context

    def listen(self) -> None:
        assert self.context is not None
        self.context.add_tick_listener(self.ticks.append)


def memory_url() -> str:
    return f"memory://{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------
# The timer


async def test_the_timer_asks_idle_wals_nothing(counted: dict[int, int]) -> None:
    """50 idle WALs and one whose tick listener keeps the timer going: while the
    listener gets 20 ticks, the timer asks the idle WALs nothing."""
    url = memory_url()
    idle = [await walsvc.open_wal(url, f"p{i}") for i in range(50)]
    listener = Listener()
    busy = await walsvc.open_wal(url, "busy", interceptors=[*default_chain(), listener])
    try:
        for wal in [*idle, busy]:
            await wal.wait_ready()
        listener.listen()
        # Two ticks: a visit since every WAL joined the timer (each is visited once).
        await until(lambda: len(listener.ticks) >= 2)
        before = {id(w): counted.get(id(w), 0) for w in idle}
        asked_busy = counted.get(id(busy), 0)
        await until(lambda: len(listener.ticks) >= 22)
        assert {id(w): counted.get(id(w), 0) for w in idle} == before
        assert counted[id(busy)] > asked_busy  # the timer did run meanwhile
        ticks = listener.ticks
        assert ticks == sorted(ticks)
        assert len(set(ticks)) == len(ticks)
    finally:
        for wal in [*idle, busy]:
            await wal.aclose()


async def test_the_timer_stops_when_every_wal_is_quiet_and_restarts_on_an_append(
    counted: dict[int, int],
) -> None:
    from interceptors import _timetick

    url = memory_url()
    wals = [await walsvc.open_wal(url, f"p{i}") for i in range(3)]
    try:
        await quiet(wals)
        loop = asyncio.get_running_loop()
        await until(lambda: (loop, _timetick.DEFAULT_SYNC_INTERVAL) not in _timetick._tickers)
        sent = await wals[1].append(message(1))
        assert not sync_of(wals[1])._quiet  # the append woke it
        assert sync_of(wals[0])._quiet
        async with wals[1].read(
            DeliverPolicy.start_after(sent.message_id), timeticks=True
        ) as scanner:
            async with asyncio.timeout(LIMIT):
                tick = await anext(scanner)
        assert (tick.type, tick.persisted) == (MessageType.TIME_TICK, True)
        assert tick.timetick > sent.timetick
        await quiet(wals)
    finally:
        for wal in wals:
            await wal.aclose()


async def test_a_scanner_waiting_on_a_quiet_wal_gets_idle_ticks() -> None:
    async with await walsvc.open_wal(memory_url(), "p") as wal:
        sent = await wal.append(message(0))
        await quiet([wal])
        async with wal.read(DeliverPolicy.start_after(sent.message_id), timeticks=True) as scanner:
            async with asyncio.timeout(LIMIT):
                first = await anext(scanner)  # the TimeTick persisted after the append
                assert (first.type, first.persisted) == (MessageType.TIME_TICK, True)
                second = await anext(scanner)  # then idle ticks, the WAL being quiet
        assert (second.type, second.persisted) == (MessageType.TIME_TICK, False)
        assert second.timetick > first.timetick
        await quiet([wal])  # the scanner is gone: quiet again


async def test_a_tick_listener_added_to_a_quiet_wal_gets_ticks() -> None:
    listener = Listener()
    async with await walsvc.open_wal(
        memory_url(), "p", interceptors=[*default_chain(), listener]
    ) as wal:
        await quiet([wal])
        listener.listen()
        await until(lambda: len(listener.ticks) >= 3)
        assert not sync_of(wal)._quiet


async def test_closing_a_quiet_wal_disarms_its_wake_up() -> None:
    wal = await walsvc.open_wal(memory_url(), "p")
    await quiet([wal])
    point = wal._point
    assert point.on_activity is not None
    await wal.aclose()
    assert point.on_activity is None
    assert sync_of(wal)._stopped


# ---------------------------------------------------------------------------------------
# The commit thread


async def test_idle_file_wals_keep_no_commit_thread(tmp_path: Path, short_idle: None) -> None:
    """20 file WALs: after an append each, their commit threads exit once idle; the
    next append starts a new one, and the TimeTick after it is persisted."""
    url = f"file://{tmp_path}"
    wals = await asyncio.gather(*(walsvc.open_wal(url, f"p{i}") for i in range(20)))
    try:
        for wal in wals:
            await wal.wait_ready()
        workers = sum(t.name.startswith("walsvc-file-writer") for t in threading.enumerate())
        assert workers <= WORKER_THREADS  # shared: not one per WAL
        for i, wal in enumerate(wals):
            await wal.append(message(i))  # past the runway batch: on the commit thread
        assert all(committer_of(w).threads_started >= 1 for w in wals)
        await until(lambda: commit_threads() == 0)
        assert not any(committer_of(w).running for w in wals)
        started = [committer_of(w).threads_started for w in wals]
        sent = [await wal.append(message(i)) for i, wal in enumerate(wals)]
        assert all(committer_of(w).threads_started > n for w, n in zip(wals, started, strict=True))
        for wal, result in zip(wals, sent, strict=True):
            scanner = wal.read(DeliverPolicy.start_after(result.message_id), timeticks=True)
            async with scanner, asyncio.timeout(LIMIT):
                # (A stale idle tick may come first: the scanner's business, not this one.)
                tick = await anext(m async for m in scanner if m.persisted)
            assert tick.type is MessageType.TIME_TICK
            assert tick.timetick > result.timetick
        await until(lambda: commit_threads() == 0)
    finally:
        for wal in wals:
            await wal.aclose()
    reader = await walsvc.open_wal(url, "p3", read_only=True)
    async with reader:
        scanner = reader.read(DeliverPolicy.all())
        async with scanner:
            got = [await anext(scanner) for _ in range(2)]
    assert [m.payload for m in got] == [b"m3", b"m3"]


async def test_a_wal_fenced_while_its_thread_is_gone_is_told_so(
    tmp_path: Path, short_idle: None
) -> None:
    url = f"file://{tmp_path}"
    old = await walsvc.open_wal(url, "p")
    try:
        await old.append(message(0))
        await old.append(message(1))
        committer = committer_of(old)
        await until(lambda: not committer.running)
        await sync_of(old).aclose()  # no TimeTick of its own: only the append below
        async with await walsvc.open_wal(url, "p") as new:
            await new.wait_ready()
            with pytest.raises(WALFenced):
                await old.append(message(2))
            assert (await new.append(message(3))).message_id is not None
    finally:
        await old.aclose()


async def test_closing_a_wal_whose_thread_is_gone(tmp_path: Path, short_idle: None) -> None:
    wal = await walsvc.open_wal(f"file://{tmp_path}", "p", interceptors=[])
    await wal.append(message(0))
    await wal.append(message(1))
    committer = committer_of(wal)
    await until(lambda: not committer.running)
    await wal.aclose()
    with pytest.raises(ValueError, match="closed"):
        committer.outcome()


def test_a_child_forked_after_the_thread_went_idle(tmp_path: Path, short_idle: None) -> None:
    """The child is refused its parent's writer (WALClosed) and opens a WAL of its own,
    whose commit thread and worker pool are its own; the parent's writer works on."""
    loop = asyncio.new_event_loop()
    try:

        async def opened() -> walsvc.WAL:
            wal = await walsvc.open_wal(f"file://{tmp_path}", "p", interceptors=[])
            for i in range(3):
                await wal.append(message(i))
            committer = committer_of(wal)
            await until(lambda: not committer.running)
            return wal

        wal = loop.run_until_complete(opened())
        writer = wal.backend._writer  # type: ignore[attr-defined]
        pid = os.fork()
        if pid == 0:  # the child: report by exit code, never return into pytest
            code = 1
            try:

                async def child() -> None:
                    with pytest.raises(WALClosed, match="forked child"):
                        writer.submit([b"x"])
                    await writer.aclose()
                    own = await walsvc.open_wal(f"file://{tmp_path}", "child", interceptors=[])
                    async with own:
                        for i in range(3):
                            await own.append(message(i))

                asyncio.new_event_loop().run_until_complete(child())
                code = 0
            finally:
                os._exit(code)
        reap(pid, LIMIT)

        async def still_works() -> None:
            await asyncio.gather(*(wal.append(message(i)) for i in range(3, 10)))
            await wal.aclose()

        loop.run_until_complete(still_works())
    finally:
        loop.close()


def test_a_committer_thread_exits_idle_and_the_next_batch_starts_another(
    tmp_path: Path,
) -> None:
    from walsvc.backends._file._head import HeadFile, HeadState

    head_path = tmp_path / "head"
    HeadFile(str(head_path), writable=True).write(HeadState(7, 0, 0, 0, 0, 0), sync=False)
    head_fd = os.open(head_path, os.O_RDWR)
    data_fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    notify_fd = os.eventfd(0)
    committer = _ccommit.Committer(head_fd, 7, notify_fd, IDLE)
    try:
        assert (committer.running, committer.threads_started) == (False, 0)  # lazily
        offset = 0
        for round_ in range(1, 4):
            committer.commit(data_fd, b"abc", offset, True, round_, 5, 0)
            os.eventfd_read(notify_fd)  # blocks until the batch is done
            assert committer.outcome() == (_ccommit.OK, 0)
            assert committer.threads_started == round_
            offset += 3
            deadline = time.monotonic() + LIMIT
            while committer.running and time.monotonic() < deadline:
                time.sleep(0.005)
            assert not committer.running
        assert os.pread(data_fd, 16, 0) == b"abc" * 3
        assert committer.syncs == 3
    finally:
        committer.close()
        for fd in (head_fd, data_fd, notify_fd):
            os.close(fd)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="idle_timeout"):
            _ccommit.Committer(0, 7, 0, bad)
