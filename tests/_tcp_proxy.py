"""A TCP proxy between clients and a node, in the test's event loop, that breaks
connections the way networks do: ``cut`` resets every connection, ``hold`` stops
forwarding one direction (or both: a half-open link) on the connections open now,
``refuse`` turns new connections away, ``retarget`` points it at a restarted node."""

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
        self.gates = {"up": asyncio.Event(), "down": asyncio.Event()}
        for gate in self.gates.values():
            gate.set()

    def abort(self) -> None:
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
