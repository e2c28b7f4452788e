"""``decode_run`` (``walsvc.core._runs``) against a reference model of filtering: a run
of envelopes read through any combination of filters, with a skip and between bounds in a
larger buffer, gives what decoding every envelope and filtering as the specification
states gives; names behind a vchannel-hash collision are checked in full."""

from __future__ import annotations

from _envelope_strategies import TEXT
from hypothesis import given
from hypothesis import strategies as st

import walsvc.core._filter
from walsvc import Filter, ImmutableMessage, Message, MessageType
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._codec import decode
from walsvc.core._encode import encode
from walsvc.core._runs import count_run, decode_run

_POOL_VCHANNELS = ["", "a", "b", "plumless", "buckeroo"]  # the last two share a CRC-32
_POOL_TYPES = [
    MessageType.TIME_TICK,
    MessageType.INSERT,
    MessageType.DELETE,
    MessageType.BEGIN_TXN,
    MessageType.COMMIT_TXN,
    MessageType.ROLLBACK_TXN,
    MessageType.TXN,
    MessageType.CREATE_COLLECTION,
    MessageType(10_000),
]
_SYSTEM = {1, 900, 901, 902, 999}  # spelled out: the model must not reuse walsvc's code


class _Model:
    """A filter as the specification states it."""

    def __init__(
        self, vchannels: frozenset[str] | None, types: frozenset[int] | None, floor: int
    ) -> None:
        self.vchannels, self.types, self.floor = vchannels, types, floor

    def admits(self, message: ImmutableMessage) -> bool:
        return (
            (self.vchannels is None or message.vchannel == "" or message.vchannel in self.vchannels)
            and (self.types is None or int(message.type) in self.types or message.type in _SYSTEM)
            and message.timetick >= self.floor
        )

    def filter(self) -> Filter:
        return Filter(vchannels=self.vchannels, types=self.types, min_timetick=self.floor)


models = st.builds(
    _Model,
    st.none() | st.frozensets(st.sampled_from([*_POOL_VCHANNELS[1:], "c"]), max_size=3),
    st.none() | st.frozensets(st.sampled_from([*(int(t) for t in _POOL_TYPES), 3, 77]), max_size=4),
    st.integers(0, 12),
)
pool_messages = st.builds(
    Message,
    payload=st.binary(max_size=20),
    vchannel=st.sampled_from(_POOL_VCHANNELS),
    type=st.sampled_from(_POOL_TYPES),
    properties=st.dictionaries(st.sampled_from(["k", "l"]), TEXT, max_size=2),
)


@given(
    st.lists(st.tuples(pool_messages, st.integers(0, 12)), max_size=14),
    st.lists(models, min_size=0, max_size=3),
    st.integers(0, 16),
    st.integers(0, 2**40),
    st.binary(max_size=40),
    st.binary(max_size=40),
)
def test_decode_run_equals_decoding_everything_and_filtering(
    items: list[tuple[Message, int]],
    filters: list[_Model],
    skip: int,
    first_seq: int,
    before: bytes,
    after: bytes,
) -> None:
    records = [encode(m, timetick=tick, term=1) for m, tick in items]
    run = b"".join(records)
    everything = [decode(r, MemoryMessageId(first_seq + i)) for i, r in enumerate(records)]
    expected = [
        m
        for i, m in enumerate(everything)
        if i >= skip and all(model.admits(m) for model in filters)
    ]
    selected = Filter.combine(model.filter() for model in filters)

    assert decode_run(run, first_seq, MemoryMessageId, selected, skip=skip) == expected
    # The same run inside a larger buffer, read between start and end.
    padded = before + run + after
    assert (
        decode_run(
            memoryview(padded),
            first_seq,
            MemoryMessageId,
            selected,
            start=len(before),
            end=len(before) + len(run),
            skip=skip,
        )
        == expected
    )
    assert count_run(padded, len(before), len(before) + len(run)) == len(records)


def test_decode_run_checks_names_behind_a_hash_collision() -> None:
    assert walsvc.core._filter.vchannel_hash(b"plumless") == walsvc.core._filter.vchannel_hash(
        b"buckeroo"
    )
    run = b"".join(
        encode(Message(payload=b"", vchannel=v), timetick=1, term=1)
        for v in ("plumless", "buckeroo", "")
    )
    got = decode_run(run, 0, MemoryMessageId, Filter(vchannels=["plumless"]))
    assert [(m.message_id.seq, m.vchannel) for m in got] == [(0, "plumless"), (2, "")]


def test_decode_run_skip_past_the_end_gives_nothing() -> None:
    run = encode(Message(payload=b"", vchannel="a"), timetick=1, term=1) * 3
    assert decode_run(run, 0, MemoryMessageId, Filter.everything(), skip=5) == []
    got = decode_run(run, 10, MemoryMessageId, Filter(), skip=2)
    assert [m.message_id.seq for m in got] == [12]
