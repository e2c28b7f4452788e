"""A TCP proxy between clients and a node, in the test's event loop, that breaks
connections the way networks do: ``cut`` resets every connection, ``hold`` stops
forwarding one direction (or both: a half-open link) on the connections open now,
``hold_new_after`` stops one direction of the next connections after their first reads
(a peer that answered one request and then stalls), ``refuse`` turns new connections
away, ``retarget`` points it at a restarted node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Literal

Direction = Literal["up", "down"]  # up: client -> node; down: node -> client


class _Pair:
    """One proxied connection: its two sockets and the two pumps between them."""

    def __init__(self, client: asyncio.StreamWriter, node: asyncio.StreamWriter) -> None:
        self.client = client
        self.node = node
        self.tasks: list[asyncio.Task[None]] = []
        self.forwarded: dict[Direction, int] = {"up": 0, "down": 0}  # reads passed on
        self.hold_after: tuple[Direction, int] | None = None
        self.closed = asyncio.Event()
        self._moved = asyncio.Condition()
        self.gates = {"up": asyncio.Event(), "down": asyncio.Event()}
        for gate in self.gates.values():
            gate.set()

    async def until_forwarded(self, direction: Direction, reads: int) -> None:
        """Wait until ``reads`` reads of ``direction`` went through."""
        async with self._moved:
            await self._moved.wait_for(lambda: self.forwarded[direction] >= reads)

    async def passed_on(self, direction: Direction) -> None:
        async with self._moved:
            self.forwarded[direction] += 1
            self._moved.notify_all()

    def abort(self) -> None:
        self.closed.set()
        for writer in (self.client, self.node):
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class TcpProxy:
    """Listens on a free loopback port and forwards each connection to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.refusing = False
        self.accepted = 0
        self.stalled = asyncio.Event()
        self._hold_new: tuple[Direction, int] | None = None
        self._pairs: set[_Pair] = set()
        self._server: asyncio.Server | None = None

    @classmethod
    def for_url(cls, node_url: str) -> TcpProxy:
        host, _, port = node_url.removeprefix("walsvc://").rpartition(":")
        return cls((host, int(port)))

    async def start(self) -> str:
        """Start listening; return the ``walsvc://`` URL clients should open."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"walsvc://127.0.0.1:{port}"

    def retarget(self, node_url: str) -> None:
        host, _, port = node_url.removeprefix("walsvc://").rpartition(":")
        self.target = (host, int(port))

    def cut(self) -> int:
        """Reset every open connection (bytes held are lost); return how many."""
        pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            pair.abort()
        return len(pairs)

    def hold(self, *directions: Direction) -> None:
        """Stop forwarding ``directions`` on the connections open now (their bytes wait
        in the proxy; the sockets stay open) until ``release``. New connections flow."""
        for pair in self._pairs:
            for direction in directions:
                pair.gates[direction].clear()

    def hold_new_after(self, direction: Direction, reads: int) -> None:
        """On connections accepted from now on, stop forwarding ``direction`` once
        ``reads`` reads of it went through, until ``release``; ``stalled`` is set then."""
        self._hold_new = (direction, reads)

    def open_pairs(self) -> list[_Pair]:
        """The connections open now."""
        return list(self._pairs)

    def release(self) -> None:
        for pair in self._pairs:
            for gate in pair.gates.values():
                gate.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            node_reader, node_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        pair = _Pair(writer, node_writer)
        pair.hold_after = self._hold_new
        self._pairs.add(pair)
        loop = asyncio.get_running_loop()
        pair.tasks = [
            loop.create_task(self._pump(reader, node_writer, "up", pair)),
            loop.create_task(self._pump(node_reader, writer, "down", pair)),
        ]

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: Direction,
        pair: _Pair,
    ) -> None:
        gate = pair.gates[direction]
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await gate.wait()
                if writer.transport.is_closing():  # cut meanwhile (uvloop raises on write)
                    break
                writer.write(data)
                await writer.drain()
                await pair.passed_on(direction)
                if pair.hold_after == (direction, pair.forwarded[direction]):
                    gate.clear()
                    self.stalled.set()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                pair.abort()

    async def aclose(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


@contextlib.asynccontextmanager
async def proxied(node_url: str) -> AsyncIterator[tuple[TcpProxy, str]]:
    """A started proxy in front of the node at ``node_url`` and the URL clients open
    through it; closed on exit."""
    proxy = TcpProxy.for_url(node_url)
    url = await proxy.start()
    try:
        yield proxy, url
    finally:
        await proxy.aclose()
