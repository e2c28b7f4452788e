"""What a stream's pump puts in one ``Delivered`` (``walsvc.service._pump._take``): the
messages while fewer than the message credit are taken and the payload bytes so far
(bodies' included) are below the byte credit and ``_DELIVERY_BYTES``, the one that
crosses it too. The summed fast path must take exactly what the message-by-message loop
takes."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from walsvc import ImmutableMessage, MessageType
from walsvc.backends._memory import MemoryMessageId
from walsvc.service._pump import _DELIVERY_BYTES, _cost, _take


def _message(size: int, body: tuple[int, ...]) -> ImmutableMessage:
    def made(kind: MessageType, payload: bytes, inner: tuple[ImmutableMessage, ...]) -> Any:
        return ImmutableMessage(
            MemoryMessageId(0), 1, "v", kind, payload, {}, None, None, None, 1, body=inner
        )

    inner = tuple(made(MessageType.INSERT, b"b" * n, ()) for n in body)
    return made(MessageType.TXN if body else MessageType.INSERT, b"p" * size, inner)


def _loop(batch: list[ImmutableMessage], start: int, messages: int, credit: int) -> tuple[int, int]:
    limit = min(credit, _DELIVERY_BYTES)
    end, spent = start, 0
    while end < len(batch) and end - start < messages and spent < limit:
        spent += _cost(batch[end])
        end += 1
    return end, spent


SIZES = st.sampled_from([0, 1, 100, 4096, _DELIVERY_BYTES // 2, _DELIVERY_BYTES])


@given(
    st.lists(
        st.tuples(SIZES, st.one_of(st.just(()), st.tuples(SIZES), st.tuples(SIZES, SIZES))),
        min_size=1,
        max_size=30,
    ),
    st.data(),
    st.integers(1, 40),
    st.integers(1, 3 * _DELIVERY_BYTES),
)
@example([(100, ())] * 5, None, 3, 10_000)
@example([(100, ())] * 5, None, 10, 250)
@example([(_DELIVERY_BYTES // 2, ())] * 2 + [(0, ())], None, 10, _DELIVERY_BYTES)
def test_take_is_the_message_by_message_loop(
    shapes: list[tuple[int, tuple[int, ...]]],
    data: st.DataObject | None,
    messages: int,
    credit: int,
) -> None:
    batch = [_message(size, body) for size, body in shapes]
    start = 0 if data is None else data.draw(st.integers(0, len(batch) - 1))
    assert _take(batch, start, messages, credit) == _loop(batch, start, messages, credit)
