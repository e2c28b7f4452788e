"""One pulsar-client client per Pulsar service (and timeouts) in the process, shared by
every WAL opened on it and kept until the process exits.

A pulsar-client client is heavy: its I/O, listener and partition-listener threads, its
connection pool and its lookup service. With one per WAL, a process with 20 WALs open on
one broker ran 83 native threads and held 152 descriptors (about 4 threads and 7
descriptors a WAL), so a node serving a hundred pchannels over ``pulsar://`` would run
some four hundred threads; Pulsar's own advice is one client per process, made once.
Shared, 20 WALs ran 34-39 threads (Python's included) and 25 descriptors, and 4 WALs of
32 producers appended 21.2-24.3k/s against 18.3-19.6k (docs/performance.md).

A client, once made, is never closed while the process runs: ``lease`` hands a WAL the
process's client with creations of the WAL's own (``Client``), and a WAL's close sees its
creations through and closes what it made, then simply stops using the client. What an
idle client costs is about three native threads and a connection to its broker. (Keeping
them does not avoid pulsar-client's crash on a freed asio timer still queued; retiring
what is closed does, below.)

At exit, before the interpreter's teardown (whose destruction of a client its own threads
still use takes the process down), ``_shut_down_at_exit`` shuts every client down, which
ends what is still in flight on it (a failed open's lookup retries until its operation
timeout otherwise), then waits for pulsar-client to let go of walsvc's callbacks
(``_client.release_callbacks``). In that order a script whose open failed on an
unreachable broker exits in 2.2 s, not 4.2 s (the wait for the retrying lookup's callback
was the difference).

Clients are shared by the service URL and the two timeouts the C++ client takes at
creation (``operation_timeout``, ``connect_timeout``); the other options are a WAL's own.
A forked child (pyspark's workers) makes clients of its own: its parent's threads are not
in it, so it never uses or shuts down its parent's clients, and holds them until the
interpreter's teardown (as a child's copies of its parent's WALs always were).

Closed readers, consumers and producers are kept a while too (``retire``): pulsar-client
arms and cancels some timers of an object both on the thread that calls it (walsvc's
event loop or call threads) and on its I/O thread, without a lock, and asio's timers are
not safe for that. When a cancel on one thread meets an arming on the other, the timer
stays queued in the I/O thread's reactor while the timer believes it has no wait
pending; freed with its object, it is a dangling entry that crashes the process when it
comes due (SIGSEGV in ``epoll_reactor::run``), or when the client is shut down (in
``epoll_reactor::shutdown``): docs/pulsar-heap-corruption.md. Traced with gdb here
(Pulsar Lite, ``tests/test_pulsar_restarts.py``): ``HandlerBase::start`` arms its creation
timer on the calling thread whenever the topic's metadata was answered before the call
looked (the I/O thread cancels that timer once connected), and ``closeAsync`` cancels
the send and statistics timers on the calling thread while the I/O thread re-arms them.
Such a timer comes due within its client's operation timeout (the creation timer; the
send timeout walsvc gives producers is that timeout too), so an object kept that long
after its close is freed only once no timer of it can still be queued. With the race made
certain by a preloaded shim (``tests/test_pulsar_timer_race.py``), a script making and
closing readers crashed so in 10 runs of 10 without the retirement and in none of 15
with it. What it costs: the memory of what was closed in the last operation timeout and
``RETIRE_SLACK`` seconds. At exit, once the clients are shut down, what is still retired
is never freed (the reactor's destruction would walk a dangling wait). Statistics are off
(``stats_interval_in_seconds=0``: walsvc reads none), which removes their timers.
"""

from __future__ import annotations

import atexit
import ctypes
import heapq
import itertools
import math
import os
import threading
import time
from typing import Final, final

import pulsar.asyncio as pulsar_asyncio

from ._client import (
    PULSAR_ERRORS,
    Client,
    Options,
    client_logger,
    release_callbacks,
    service_url,
    translate,
)

__all__ = ("RETIRE_SLACK", "lease", "retire", "retired", "shared_clients")

_Key = tuple[str, int, int]

#: Seconds a closed reader, consumer or producer is kept beyond the longest operation
#: timeout of the process's clients (``retire``).
RETIRE_SLACK: Final = 5.0


@final
class _Registry:
    """The clients this process made, by key, and the inherited ones of its parent."""

    __slots__ = ("clients", "inherited", "lock", "pid", "retired")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # event loops in several threads may open WALs
        self.clients: dict[_Key, pulsar_asyncio.Client] = {}
        #: Closed readers, consumers and producers (``retire``): a heap of (the time it
        #: may be freed, a tie-breaker, the object).
        self.retired: list[tuple[float, int, object]] = []
        #: A forked parent's clients and retired objects: held, never used, shut down
        #: or freed (freeing one while the child runs would run its destructor, which
        #: joins threads or touches timers of threads that do not exist in this process).
        self.inherited: list[object] = []
        self.pid = os.getpid()

    def live(self) -> dict[_Key, pulsar_asyncio.Client]:
        """This process's clients (call under the lock)."""
        self._forked()
        return self.clients

    def kept(self) -> list[tuple[float, int, object]]:
        """This process's retired objects, a heap by the time each may go (call under
        the lock)."""
        self._forked()
        return self.retired

    def _forked(self) -> None:
        if self.pid != os.getpid():
            self.inherited.extend(self.clients.values())
            self.inherited.extend(kept for _, _, kept in self.retired)
            self.clients.clear()
            self.retired.clear()
            self.pid = os.getpid()


_registry: Final = _Registry()


def lease(location: str, options: Options) -> Client:
    """The process's client of ``location`` (``host:port``) with the timeouts of
    ``options``, made now if there is none (it connects lazily, on the first lookup,
    producer or reader), with creations of the caller's own."""
    url = service_url(location)
    key = (
        url,
        max(1, math.ceil(options.operation_timeout)),
        max(1, int(options.connect_timeout * 1000)),
    )
    with _registry.lock:
        clients = _registry.live()
        client = clients.get(key)
        if client is None:
            client = clients[key] = _new_client(*key)
    return Client(client, url, options)


def shared_clients() -> int:
    """How many clients this process has made and keeps (for tests)."""
    with _registry.lock:
        return len(_registry.live())


_tie_breaker: Final = itertools.count()


def retire(closing: object) -> None:
    """Keep ``closing`` (a reader, consumer or producer whose close is starting, or a
    wrapper of one) alive for the longest operation timeout of the process's clients
    plus ``RETIRE_SLACK`` seconds, so that no timer of it is freed while still queued
    (see the module's docstring); it is kept whether its close succeeds or not. Frees
    the retired objects whose time is up, on the calling thread."""
    with _registry.lock:
        longest = max((key[1] for key in _registry.live()), default=0)
        kept = _registry.kept()
        now = time.monotonic()
        heapq.heappush(kept, (now + longest + RETIRE_SLACK, next(_tie_breaker), closing))
        due = []
        while kept and kept[0][0] <= now:
            due.append(heapq.heappop(kept))
    del due  # freed outside the lock: a destructor may wait for pulsar-client's locks


def retired() -> list[object]:
    """The closed objects this process keeps now (for tests)."""
    with _registry.lock:
        return [kept for _, _, kept in _registry.kept()]


def _new_client(url: str, operation_timeout: int, connect_timeout_ms: int) -> pulsar_asyncio.Client:
    try:
        return pulsar_asyncio.Client(
            url,
            operation_timeout_seconds=operation_timeout,
            connection_timeout_ms=connect_timeout_ms,
            stats_interval_in_seconds=0,
            logger=client_logger(),
        )
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot create a Pulsar client for {url}") from exc


@atexit.register
def _shut_down_at_exit() -> None:
    """At interpreter exit, before its teardown: shut this process's clients down (their
    connections and threads end, without a word to the broker) and free them, keep the
    objects still retired from ever being freed (``_never_free``), then wait until
    pulsar-client let go of walsvc's callbacks."""
    with _registry.lock:
        clients = list(_registry.live().values())
        _registry.clients.clear()
    for client in clients:
        try:
            client.shutdown()
        except PULSAR_ERRORS:
            pass
    with _registry.lock:
        for _, _, kept in _registry.kept():
            _never_free(kept)
    del clients
    release_callbacks()


def _never_free(kept: object) -> None:
    """Keep ``kept`` alive until the process is gone: the interpreter's teardown will not
    free it. A retired object may hold a timer still queued in its client's reactor (see
    the module's docstring), which nothing will now run (the client is shut down), and
    which the reactor's own destruction walks: the object's memory must outlive it."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))
