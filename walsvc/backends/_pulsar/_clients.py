"""One pulsar-client client per Pulsar service (and timeouts) in the process, shared by
every WAL opened on it.

A pulsar-client client is heavy: its I/O, listener and partition-listener threads, its
connection pool and its lookup service. With one per WAL, a process with 20 WALs open on
one broker ran 83 native threads and held 152 descriptors (about 4 threads and 7
descriptors a WAL), so a node serving a hundred pchannels over ``pulsar://`` would run
some four hundred threads; Pulsar's own advice is one client per process. ``lease`` hands
a WAL a ``Client``: the shared C++ client and the WAL's own creations (``_creations``).
``release`` gives it back once the WAL saw its creations through and closed what it made;
the last release closes the shared client. A WAL closed while the broker is away (the
client's lookups retrying on their timers) so closes no client that another WAL uses.

Clients are shared by the service URL and the two timeouts the C++ client takes at
creation (``operation_timeout``, ``connect_timeout``); the other options are a WAL's own.
The registry refers to the shared clients weakly: a lease dropped without its release (a
WAL never closed) frees its client with it, when the cycle collector runs (at exit,
``_client``'s hook runs it before the interpreter's teardown). A forked child starts with
no shared client: its parent's threads are not its own.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import weakref
from typing import Final, final

import pulsar.asyncio as pulsar_asyncio

from ._calls import close_client
from ._client import PULSAR_ERRORS, Client, Options, client_logger, service_url, translate

__all__ = ("lease", "release", "shared_clients")

#: Seconds the last release waits for the shared client's close, after which the client
#: is shut down (its connections and threads end without a word to the broker).
CLOSE_WITHIN: Final = 1.0

_Key = tuple[str, int, int]


@final
class _Shared:
    """One shared client and how many leases of it are out."""

    __slots__ = ("__weakref__", "key", "leases", "pulsar")

    def __init__(self, key: _Key, client: pulsar_asyncio.Client) -> None:
        self.key = key
        self.pulsar = client
        self.leases = 0


@final
class _Registry:
    """The shared clients of this process, weakly, by key (see the module's docs)."""

    __slots__ = ("clients", "lock", "pid")

    def __init__(self) -> None:
        self.lock = threading.Lock()  # event loops in several threads may open WALs
        self.clients: dict[_Key, weakref.ref[_Shared]] = {}
        self.pid = os.getpid()

    def live(self) -> dict[_Key, weakref.ref[_Shared]]:
        """The clients (under the lock), none in a forked child: its parent's clients
        are not its own."""
        if self.pid != os.getpid():
            self.clients.clear()
            self.pid = os.getpid()
        return self.clients


_registry: Final = _Registry()


def lease(location: str, options: Options) -> Client:
    """A lease of the process's client of ``location`` (``host:port``) with the timeouts
    of ``options``, made now if there is none (it connects lazily, on the first lookup,
    producer or reader). Give it back with ``release``."""
    url = service_url(location)
    key = (
        url,
        max(1, math.ceil(options.operation_timeout)),
        max(1, int(options.connect_timeout * 1000)),
    )
    with _registry.lock:
        clients = _registry.live()
        found = clients.get(key)
        shared = None if found is None else found()
        if shared is None:
            shared = _Shared(key, _new_client(*key))
            clients[key] = weakref.ref(shared)
        shared.leases += 1
    return Client(shared.pulsar, url, shared)


async def release(client: Client) -> None:
    """Give back a lease (once; again is a no-op). The last one out closes the shared
    client within ``CLOSE_WITHIN`` seconds, else shuts it down. Never raises."""
    shared = client.release()
    if not isinstance(shared, _Shared):
        return
    with _registry.lock:
        shared.leases -= 1
        if shared.leases > 0:
            return
        clients = _registry.live()
        found = clients.get(shared.key)
        if found is not None and found() is shared:
            del clients[shared.key]  # a lease from now on makes a new client
    try:
        async with asyncio.timeout(CLOSE_WITHIN):
            await close_client(client)
    except (TimeoutError, *PULSAR_ERRORS):
        try:
            shared.pulsar.shutdown()
        except PULSAR_ERRORS:
            pass


def shared_clients() -> int:
    """How many shared clients the process has now (for tests and status)."""
    with _registry.lock:
        return sum(1 for ref in _registry.live().values() if ref() is not None)


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
