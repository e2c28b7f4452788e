"""Hypothesis strategies for envelopes' fields and for whole envelopes (``envelopes``),
shared by the codec's tests; ``in_python``: a call with walsvc's compiled loops switched
off; ``damage``: a run with bytes flipped and its tail cut."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

import walsvc.core._compiled
from walsvc import Message, MessageType, TxnContext
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._encode import encode

U64 = st.integers(0, 2**64 - 1)
# Lone surrogates cannot be UTF-8 encoded: Message rejects them (tests/test_errors...).
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=24)
MESSAGE_TYPES = st.one_of(
    st.sampled_from(list(MessageType)), st.integers(10_000, 65_535).map(MessageType)
)
PAYLOADS = st.one_of(
    st.binary(max_size=300),
    # Large payloads, built cheaply from a short pattern.
    st.builds(
        lambda pattern, n: pattern * n, st.binary(min_size=1, max_size=3), st.integers(1, 200_000)
    ),
)
TXNS = st.one_of(
    st.none(), st.builds(TxnContext, st.integers(-(2**63), 2**64 - 1), st.integers(0, 2**64 - 1))
)
IDS = st.builds(MemoryMessageId, U64)
MESSAGES = st.builds(
    Message,
    payload=PAYLOADS,
    vchannel=TEXT,
    type=MESSAGE_TYPES,
    properties=st.dictionaries(TEXT, TEXT, max_size=6),
    idempotency_key=st.none() | TEXT,
)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[Message, dict[str, Any], bytes]:
    """A message, the system fields it was encoded with, and its envelope."""
    message = draw(MESSAGES)
    system = {
        "timetick": draw(U64),
        "term": draw(U64),
        "last_confirmed": draw(st.none() | IDS),
        "txn": draw(TXNS),
    }
    return message, system, encode(message, **system)


def in_python(function: Any, *args: Any) -> Any:
    """``function(*args)`` with walsvc's compiled loops switched off."""
    compiled = walsvc.core._compiled
    names = compiled.__all__
    saved = [getattr(compiled, name) for name in names]
    for name in names:
        setattr(compiled, name, None)
    try:
        return function(*args)
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(compiled, name, value)


def damage(run: bytearray, start: int, flips: list[tuple[int, int]], cut: int) -> bytes:
    """``run`` with, after byte ``start``, each (position, value) of ``flips`` written
    (positions wrap around that body) and ``cut`` bytes (wrapping too) cut from its end."""
    body = len(run) - start
    if body:
        for position, value in flips:
            run[start + position % body] = value
        if cut:
            del run[len(run) - cut % body :]
    return bytes(run)
