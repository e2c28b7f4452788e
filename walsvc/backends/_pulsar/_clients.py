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
idle client costs is about three native threads and a connection to its broker. Keeping
them was also meant to avoid pulsar-client 3.12's crash on a freed asio timer still
queued, seen in clients' closes; it does not (the timer is freed under broker faults and
crashes the process when it comes due, in a close or later:
docs/pulsar-heap-corruption.md).

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
"""

from __future__ import annotations

import atexit
import math
import os
import threading
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

__all__ = ("lease", "shared_clients")

_Key = tuple[str, int, int]


@final
class _Registry:
    """The clients this process made, by key, and the inherited ones of its parent."""

    __slots__ = ("clients", "inherited", "lock", "pid")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # event loops in several threads may open WALs
        self.clients: dict[_Key, pulsar_asyncio.Client] = {}
        #: A forked parent's clients: held, never used or shut down (freeing one while
        #: the child runs would run its destructor, which joins threads that do not
        #: exist in this process).
        self.inherited: list[pulsar_asyncio.Client] = []
        self.pid = os.getpid()

    def live(self) -> dict[_Key, pulsar_asyncio.Client]:
        """This process's clients (call under the lock)."""
        if self.pid != os.getpid():
            self.inherited.extend(self.clients.values())
            self.clients.clear()
            self.pid = os.getpid()
        return self.clients


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


def _new_client(url: str, operation_timeout: int, connect_timeout_ms: int) -> pulsar_asyncio.Client:
    try:
        return pulsar_asyncio.Client(
            url,
            operation_timeout_seconds=operation_timeout,
            connection_timeout_ms=connect_timeout_ms,
            logger=client_logger(),
        )
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"cannot create a Pulsar client for {url}") from exc


@atexit.register
def _shut_down_at_exit() -> None:
    """At interpreter exit, before its teardown: shut this process's clients down (their
    connections and threads end, without a word to the broker), free them, then wait
    until pulsar-client let go of walsvc's callbacks."""
    with _registry.lock:
        clients = list(_registry.live().values())
        _registry.clients.clear()
    for client in clients:
        try:
            client.shutdown()
        except PULSAR_ERRORS:
            pass
    del clients
    release_callbacks()
