"""A process that used ``pulsar://`` exits cleanly, and a closed WAL leaves nothing
running behind it but the process's client, which its later WALs use.

pulsar-client objects destroyed during the interpreter's teardown crash the process
while the client's C++ threads still run (SIGSEGV, or SIGABRT after "terminate called
without an active exception": seen in CI after a test's script had printed its last
line). A closed WAL's client and producer stay alive in reference cycles until the
cyclic collector runs, which at exit is during that teardown; so walsvc frees them in
an ``atexit`` hook. The crash itself is a race (4 runs in 40 on a loaded machine); the
test checks the hook's effect, which is not: by the time the interpreter tears down, no
pulsar-client object of a closed WAL is alive.

A reader made through ``pulsar.asyncio`` also stayed alive after its close, with its
client's I/O threads: the C++ client keeps the callback that announced the reader, and
that callback held the asyncio future whose result is the reader. walsvc's callbacks
let go of their future once called; the second test counts the native threads left.

A client closed while a reader was still being created (a read just started, or a
ready hook's look at the log cancelled by the close) leaked that creation with its I/O
context: one native thread and six descriptors (seen in CI as "native threads left: 1",
under load). The client now waits for the creations in flight on it (``_creations``);
a test closes WALs at random points of a read's start.

A process that ends with a WAL still open aborted too: pulsar-client answered calls
after the loop closed (``pulsar.asyncio``'s callbacks then raise in the client's
thread), and freed their callbacks after the teardown began. walsvc makes those calls
itself (``_calls``) and its exit hook waits for the callbacks to be freed; the last
test leaves WALs open at random points of a read's start.

The WALs of a process share one client per broker, kept until exit (``_clients``), so
"nothing left behind" means: after the first WAL, the process's native threads and I/O
descriptors do not grow with more WALs, however they end; at exit, the client is shut
down before the teardown.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

from _pulsar_lite import HANG, PulsarLite, broker, pchannel

import walsvc
from walsvc.backends._pulsar._calls import close, create_producer, subscribe
from walsvc.backends._pulsar._client import parse_options
from walsvc.backends._pulsar._clients import lease
from walsvc.backends._pulsar._log import EARLIEST, create_reader

__all__ = ("broker",)

#: Every script's start: ``native_threads(at_most)`` (the process's threads that are not
#: Python's, after a collection; polled for up to 5 s until there are ``at_most`` or, with
#: no ``at_most``, until the count held for 0.2 s, since a thread that just ended is
#: listed in /proc a moment after it is joined and after Python forgets it),
#: ``io_descriptors()`` (epoll, eventfd, timerfd: anonymous
#: inodes, what an I/O context holds), and a
#: report registered before walsvc makes its first client, so that it runs after
#: walsvc's own exit hook (atexit runs hooks last-in first-out): the pulsar-client
#: objects still alive then, but for those closed and retired (``_clients.retire``: kept
#: alive, never freed once the client is shut down).
_CHECK_AT_EXIT = """
    import atexit, gc, os, sys, threading, time

    def native_threads(at_most=None):
        deadline = time.monotonic() + 5
        seen = []
        while True:
            gc.collect()
            native = len(os.listdir("/proc/self/task")) - len(threading.enumerate())
            seen.append(native)
            if at_most is not None and native <= at_most:
                return native
            if at_most is None and len(seen) > 20 and len(set(seen[-21:])) == 1:
                return native
            if time.monotonic() > deadline:
                return native
            time.sleep(0.01)

    def io_descriptors():
        kinds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                kinds.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass  # the listing's own descriptor
        return sum(kind.startswith("anon_inode") for kind in kinds)

    def report():
        import pulsar.asyncio
        from walsvc.backends._pulsar._clients import retired
        kinds = (pulsar.asyncio.Client, pulsar.asyncio.Producer, pulsar.asyncio.Consumer)
        kept = {id(o) for o in retired()}
        alive = sorted(
            type(o).__name__
            for o in gc.get_objects()
            if isinstance(o, kinds) and id(o) not in kept
        )
        print("alive at exit:", alive, flush=True)

    atexit.register(report)
"""


def _run(script: str, broker: PulsarLite) -> subprocess.CompletedProcess[str]:
    root = str(Path(walsvc.__file__).resolve().parent.parent)
    code = textwrap.dedent(_CHECK_AT_EXIT) + textwrap.dedent(script)
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, broker.url, pchannel()],
        env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
    )


def _outcome(result: subprocess.CompletedProcess[str]) -> str:
    """A child's exit status and whole output, for an assertion's message (pytest cuts
    the repr of an object there to a line, and with it the faulthandler's report)."""
    return f"exit status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_a_closed_wal_leaves_no_pulsar_object_to_the_teardown(broker: PulsarLite) -> None:
    result = _run(
        """
        import asyncio, walsvc
        from walsvc import DeliverPolicy, Message

        async def main():
            async with await walsvc.open_wal(sys.argv[1], sys.argv[2]) as wal:
                await wal.append(Message(payload=b"x", vchannel="v"))
                async with wal.read(DeliverPolicy.all()) as scanner:
                    await anext(scanner)

        asyncio.run(main())
        """,
        broker,
    )
    assert (result.returncode, result.stderr) == (0, ""), _outcome(result)
    assert result.stdout == "alive at exit: []\n"


def test_a_closed_wal_its_user_still_holds_holds_no_producer(broker: PulsarLite) -> None:
    """The close frees the producer while its client still runs, even if the WAL object
    lives on (holding its closed client, which has nothing it made left alive). Freed
    later, after its client, a producer would be the last holder of the client's I/O
    executor, and its destructor would tear the executor down (a SIGSEGV in
    ``epoll_reactor::shutdown`` from ``~HandlerBase`` was seen so, in a producer a
    collection freed in a later test)."""
    result = _run(
        """
        import asyncio, gc, walsvc
        from walsvc import Message

        async def main():
            wal = await walsvc.open_wal(sys.argv[1], sys.argv[2])
            await wal.append(Message(payload=b"x", vchannel="v"))
            await wal.aclose()
            return wal

        wal = asyncio.run(main())
        gc.collect()
        report()
        print("still held:", type(wal).__name__)
        """,
        broker,
    )
    assert (result.returncode, result.stderr) == (0, ""), _outcome(result)
    assert result.stdout.splitlines()[:2] == ["alive at exit: ['Client']", "still held: LocalWAL"]


async def test_each_pulsar_object_walsvc_makes_holds_its_client(broker: PulsarLite) -> None:
    """Whatever order their owners are freed in, a producer, consumer or reader goes
    before the C++ client that made it (see ``_calls.holding``): each holds it."""
    client = lease(broker.url.removeprefix("pulsar://"), parse_options({}))
    topic = f"persistent://public/default/{pchannel()}"
    made = [
        await create_producer(client, topic, send_timeout_millis=5000, batching_enabled=False),
        await subscribe(client, topic, "holds", receiver_queue_size=1),
    ]
    reader = await create_reader(client, topic, EARLIEST, inclusive=True)
    made.append(reader._reader)
    try:
        for resource in made:
            assert _reaches(resource, client.raw), type(resource).__name__
    finally:
        for resource in made[:2]:
            await close(resource)
        await reader.close()
        await client.creations.aclose(1.0)


def _reaches(start: object, target: object, depth: int = 3) -> bool:
    """Whether ``target`` is among the objects ``start`` refers to, ``depth`` steps deep."""
    seen = [start]
    for _ in range(depth):
        seen = [o for obj in seen for o in gc.get_referents(obj)]
        if any(o is target for o in seen):
            return True
    return False


def test_closed_wals_leave_no_native_thread_behind(broker: PulsarLite) -> None:
    """WALs opened (the default chain: its ready hooks read the log), appended to, read
    and closed, one after another: the process runs the same native threads (its one
    client's) after the fifth as after the first, and had none before."""
    result = _run(
        """
        import asyncio, walsvc
        from walsvc import DeliverPolicy, Message

        async def main(pchannel):
            async with await walsvc.open_wal(sys.argv[1], pchannel) as wal:
                await wal.append(Message(payload=b"x", vchannel="v"))
                async with wal.read(DeliverPolicy.all()) as scanner:
                    await anext(scanner)

        before = native_threads(0)
        asyncio.run(main(f"{sys.argv[2]}-0"))
        first = native_threads()
        for i in range(1, 5):
            asyncio.run(main(f"{sys.argv[2]}-{i}"))
        print("native threads:", before, first == native_threads(first) > 0)
        """,
        broker,
    )
    assert (result.returncode, result.stderr) == (0, ""), _outcome(result)
    assert result.stdout == "native threads: 0 True\nalive at exit: []\n"


def test_reads_cancelled_at_random_points_leave_no_native_thread_behind(
    broker: PulsarLite,
) -> None:
    """Reads cancelled after a random number of loop turns (some while their reader is
    being made, some while it waits for messages), then the WAL closed: no native thread
    or I/O descriptor more than before the reads is left, and a fresh read still
    delivers every acknowledged message, once, in order."""
    result = _run(
        """
        import asyncio, random, walsvc
        from walsvc import DeliverPolicy, Message

        async def read_some(wal):
            async with wal.read(DeliverPolicy.all()) as scanner:
                async for _ in scanner:
                    pass

        async def main():
            rng = random.Random(7)
            async with await walsvc.open_wal(sys.argv[1], sys.argv[2]) as wal:
                acked = [await wal.append(Message(payload=b"%d" % i, vchannel="v"))
                         for i in range(20)]
                before = (native_threads(), io_descriptors())
                for _ in range(12):
                    reading = asyncio.ensure_future(read_some(wal))
                    for _ in range(rng.randrange(0, 40)):
                        await asyncio.sleep(0)
                    reading.cancel()
                    await asyncio.gather(reading, return_exceptions=True)
                got = []
                async with wal.read(DeliverPolicy.all()) as scanner:
                    async for m in scanner:
                        got.append(m.message_id)
                        if m.message_id == acked[-1].message_id:
                            break
                assert got == [a.message_id for a in acked], got
            threads, descriptors = before  # the loop's own epoll is in both counts
            print("more left:", native_threads(threads) - threads, io_descriptors() - descriptors)

        asyncio.run(main())
        """,
        broker,
    )
    assert (result.returncode, result.stderr) == (0, ""), _outcome(result)
    assert result.stdout == "more left: 0 0\nalive at exit: []\n"


def test_wals_closed_while_a_read_is_being_created_leave_nothing_behind(
    broker: PulsarLite,
) -> None:
    """Eight WALs, each closed after a random number of loop turns of a read's start
    (most while its reader is being created): no native thread and no I/O context
    (epoll, eventfd, timerfd: anonymous inodes) more than the first WAL's client's is
    left. Before the fix, 6 closes in 64 left one thread and six descriptors each."""
    result = _run(
        """
        import asyncio, random, walsvc
        from walsvc import DeliverPolicy, Message

        async def first(pchannel):
            async with await walsvc.open_wal(sys.argv[1], pchannel) as wal:
                await wal.append(Message(payload=b"x", vchannel="v"))

        async def read_one(wal):
            async with wal.read(DeliverPolicy.all()) as scanner:
                await anext(scanner)

        async def main(pchannel, turns):
            wal = await walsvc.open_wal(sys.argv[1], pchannel)
            await wal.append(Message(payload=b"x", vchannel="v"))
            reading = asyncio.ensure_future(read_one(wal))
            for _ in range(turns):
                await asyncio.sleep(0)
            await wal.aclose()
            await asyncio.gather(reading, return_exceptions=True)

        asyncio.run(first(f"{sys.argv[2]}-first"))
        threads, descriptors = native_threads(), io_descriptors()
        rng = random.Random(11)
        for i in range(8):
            asyncio.run(main(f"{sys.argv[2]}-{i}", rng.randrange(0, 30)))
        print("more left:", native_threads(threads) - threads, io_descriptors() - descriptors)
        """,
        broker,
    )
    assert (result.returncode, result.stderr) == (0, ""), _outcome(result)
    assert result.stdout == "more left: 0 0\nalive at exit: []\n"


def test_a_process_that_ends_with_a_wal_open_while_a_read_starts_exits_cleanly(
    broker: PulsarLite,
) -> None:
    """Six processes, each leaving its WAL open when ``asyncio.run`` ends, a random
    number of loop turns into a read's start (its reader or its look at the tail still
    being made): each exits 0. Before the fix, 9 such processes in 12 aborted (SIGABRT):
    an answer of pulsar-client that came after the loop closed raised in its thread, or
    its callback was freed after the teardown began."""
    for seed in range(6):
        result = _run(
            f"""
            import asyncio, random, walsvc
            from walsvc import DeliverPolicy, Message

            async def read_one(wal):
                async with wal.read(DeliverPolicy.all()) as scanner:
                    await anext(scanner)

            async def main():
                wal = await walsvc.open_wal(sys.argv[1], sys.argv[2])
                await wal.append(Message(payload=b"x", vchannel="v"))
                asyncio.ensure_future(read_one(wal))
                for _ in range(random.Random({seed}).randrange(0, 30)):
                    await asyncio.sleep(0)

            asyncio.run(main())
            print("left open")
            """,
            broker,
        )
        assert (result.returncode, result.stdout.splitlines()[:1]) == (0, ["left open"]), _outcome(
            result
        )
