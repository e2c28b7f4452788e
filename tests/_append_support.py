"""What the append encoding tests share (``test_append_request_encoding``,
``test_append_answer_decoding``): a ``RemoteWAL``, on its compiled or its Python path,
over a stand-in connection that answers every request at once; plain messages; and
outcomes (a value, or an error's type and text) to compare the two paths by."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from hypothesis import strategies as st

from walsvc import Message
from walsvc.core._message import AppendResult
from walsvc.remote import _client
from walsvc.remote._pending import Pending
from walsvc.remote._protocol import Appended, AppendMany, Opened, WireResult

__all__ = (
    "INT64",
    "Answered",
    "InstantConnection",
    "encode",
    "outcome",
    "plain",
    "remote_wal",
    "run",
    "wal_append",
    "wal_append_many",
)

encode = msgspec.msgpack.Encoder().encode
#: Every int msgpack writes (64-bit signed and unsigned).
INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)


def plain(**changes: Any) -> Message:
    """A message with payload ``b"x"`` on vchannel "v", and ``changes``."""
    fields: dict[str, Any] = {"payload": b"x", "vchannel": "v"}
    fields.update(changes)
    return Message(**fields)


def outcome(call: Any) -> Any:
    """What ``call()`` returns, or the type and text of the exception it raises."""
    try:
        return call()
    except Exception as exc:
        return (type(exc), str(exc))


class InstantConnection:
    """Stands in for ``Connection``: records each request (its bytes and resend flag)
    and answers it at once, with ``answer`` or memory ids counting up. Every request
    id is 1: a call the compiled path declined takes another id on its Python path,
    and the requests of the two paths are compared byte for byte."""

    def __init__(self, answer: list[WireResult] | None) -> None:
        self.sent: list[tuple[bytes, bool]] = []
        self.full = False
        self.waited = False
        self._answer = answer
        self._positions = itertools.count(100)

    def on_reconnect(self, reopen: Any) -> None:
        pass

    def saw_tick(self, timetick: int) -> None:
        pass

    async def room(self) -> None:
        self.waited = True
        self.full = False

    def next_id(self) -> int:
        return 1

    def request(self, item: Any, request: int, *, append: bool, resend: bool) -> Pending:
        data = item if type(item) is bytes else encode(item)
        self.sent.append((data, resend))
        fields = msgspec.msgpack.decode(data)  # untyped: properties may not be str
        count = len(fields[3]) if fields[0] == AppendMany.__struct_config__.tag else 1
        answer = self._answer or [
            WireResult(f"memory:{next(self._positions)}", 1000 + i, "memory:99")
            for i in range(count)
        ]
        future = asyncio.get_running_loop().create_future()
        future.set_result(Appended(request, answer))
        return Pending(future, item, append, resend)


class Answered(msgspec.Struct, frozen=True):
    """What a ``RemoteWAL`` call over an ``InstantConnection`` gave: its results, the
    requests it sent (bytes, resend flag) and its producer key counter after."""

    results: list[AppendResult]
    sent: list[tuple[bytes, bool]]
    next_key: int


def remote_wal(conn: InstantConnection) -> _client.RemoteWAL:
    """A ``RemoteWAL`` on ``conn`` (handle 7, memory ids) whose producer keys start at
    "~p.5"."""
    wal = _client.RemoteWAL(
        conn,  # type: ignore[arg-type]
        Opened(1, 7, 1, False, "memory"),
        "p",
        (16, 1 << 20),
    )
    assert wal._keys is not None
    wal._keys._prefix = "~p."
    wal._keys._next = 5
    return wal


async def wal_append_many(
    batch: list[Any],
    *,
    compiled: bool = True,
    answer: list[WireResult] | None = None,
    full: bool = False,
) -> Answered:
    """``append_many(batch)`` of a fresh ``remote_wal``, on the compiled path or not;
    ``full``: the connection has no room at first, and the call waits for it."""
    return await _answered(lambda wal: wal.append_many(batch), compiled, answer, full)


async def wal_append(message: Any, *, compiled: bool = True, full: bool = False) -> Answered:
    """``append(message)`` of a fresh ``remote_wal``, as ``wal_append_many``."""

    async def append(wal: _client.RemoteWAL) -> list[AppendResult]:
        return [await wal.append(message)]

    return await _answered(append, compiled, None, full)


async def _answered(
    call: Callable[[_client.RemoteWAL], Awaitable[list[AppendResult]]],
    compiled: bool,
    answer: list[WireResult] | None,
    full: bool,
) -> Answered:
    conn = InstantConnection(answer)
    conn.full = full
    wal = remote_wal(conn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_client, "compiled", compiled)
        results = await call(wal)
    assert wal._keys is not None
    return Answered(results, conn.sent, wal._keys._next)


def run(coroutine: Any) -> Any:
    """``coroutine`` run to its end on a fresh event loop (for synchronous tests)."""
    return asyncio.run(coroutine)
