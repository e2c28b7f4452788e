"""Filter semantics: a conjunction of vchannels, types and a timetick floor, where a
broadcast (vchannel "") passes every vchannel filter and system messages pass every type
filter."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import walsvc
from walsvc import Filter, ImmutableMessage, Message, MessageType
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._encode import encode
from walsvc.core._filter import vchannel_hash
from walsvc.testing import memory_wal

VCHANNELS = ["", "a", "b", "plumless", "buckeroo"]  # the last two share a CRC-32
TYPES = [
    MessageType.TIME_TICK,
    MessageType.INSERT,
    MessageType.DELETE,
    MessageType.BEGIN_TXN,
    MessageType.COMMIT_TXN,
    MessageType.ROLLBACK_TXN,
    MessageType.TXN,
    MessageType.DROP_COLLECTION,
    MessageType(10_000),
]
SYSTEM = [
    MessageType.TIME_TICK,
    MessageType.BEGIN_TXN,
    MessageType.COMMIT_TXN,
    MessageType.ROLLBACK_TXN,
    MessageType.TXN,
]


def message(
    vchannel: str = "a", type_: MessageType = MessageType.INSERT, tick: int = 5
) -> ImmutableMessage:
    return ImmutableMessage(MemoryMessageId(0), tick, vchannel, type_, b"", {}, None, None, None, 1)


filters = st.builds(
    Filter,
    vchannels=st.none() | st.frozensets(st.sampled_from([*VCHANNELS[1:], "c"]), max_size=3),
    types=st.none() | st.frozensets(st.sampled_from([*(int(t) for t in TYPES), 3]), max_size=4),
    min_timetick=st.integers(0, 10),
)
messages = st.builds(
    message, st.sampled_from(VCHANNELS), st.sampled_from(TYPES), st.integers(0, 10)
)


def admitted_by_prefilter(f: Filter, m: ImmutableMessage) -> bool:
    return f.prefilter(int(m.type), vchannel_hash(m.vchannel.encode()), m.timetick)


# ---------------------------------------------------------------------------------------
# The rules


def test_everything_admits_everything() -> None:
    f = Filter.everything()
    assert f.is_everything
    assert Filter().is_everything
    assert f == Filter()
    for v in VCHANNELS:
        for t in TYPES:
            assert f.admits(message(v, t, 0))


def test_vchannel_filter_admits_its_vchannels_and_broadcasts() -> None:
    f = Filter(vchannels=["a"])
    assert f.admits(message("a"))
    assert f.admits(message(""))  # a broadcast goes to every vchannel
    assert not f.admits(message("b"))
    assert not f.is_everything


def test_empty_vchannel_set_admits_only_broadcasts() -> None:
    f = Filter(vchannels=[])
    assert f.admits(message(""))
    assert not f.admits(message("a"))


@pytest.mark.parametrize("system_type", SYSTEM)
def test_type_filters_never_drop_system_messages(system_type: MessageType) -> None:
    f = Filter(types=[MessageType.INSERT])
    assert f.admits(message(type_=MessageType.INSERT))
    assert not f.admits(message(type_=MessageType.DELETE))
    assert f.admits(message(type_=system_type))
    assert Filter(types=[]).admits(message(type_=system_type))
    assert admitted_by_prefilter(Filter(types=[]), message(type_=system_type))


def test_timetick_floor_applies_to_every_message() -> None:
    f = Filter(min_timetick=5)
    assert f.admits(message(tick=5))
    assert not f.admits(message(tick=4))
    assert not f.admits(message("", MessageType.TIME_TICK, 4))  # broadcast, system: still
    assert not admitted_by_prefilter(f, message("", MessageType.TIME_TICK, 4))


def test_types_compare_by_number() -> None:
    assert Filter(types=[MessageType.INSERT]) == Filter(types=[2])
    assert Filter(types=[2]).admits(message(type_=MessageType.INSERT))
    assert Filter(types=[10_000]).admits(message(type_=MessageType(10_000)))


def test_prefilter_defers_hash_collisions_to_admits() -> None:
    assert vchannel_hash(b"plumless") == vchannel_hash(b"buckeroo")
    f = Filter(vchannels=["plumless"])
    assert admitted_by_prefilter(f, message("buckeroo"))  # "maybe"
    assert not f.admits(message("buckeroo"))  # the exact test decides
    assert not admitted_by_prefilter(f, message("b"))


def test_vchannel_hash_of_broadcast_is_zero() -> None:
    assert vchannel_hash(b"") == 0
    assert vchannel_hash(b"a") != 0


# ---------------------------------------------------------------------------------------
# Composition


@given(filters, filters, messages)
def test_and_is_conjunction(f: Filter, g: Filter, m: ImmutableMessage) -> None:
    assert (f & g).admits(m) == (f.admits(m) and g.admits(m))
    assert (f & g) == (g & f)


@given(st.lists(filters, max_size=4), messages)
def test_combine_is_conjunction_of_all(fs: list[Filter], m: ImmutableMessage) -> None:
    assert Filter.combine(fs).admits(m) == all(f.admits(m) for f in fs)


@given(filters, messages)
def test_prefilter_never_rejects_an_admitted_message(f: Filter, m: ImmutableMessage) -> None:
    if f.admits(m):
        assert admitted_by_prefilter(f, m)


@given(filters)
def test_everything_is_the_identity_of_and(f: Filter) -> None:
    assert (f & Filter.everything()) == f
    assert (Filter.everything() & f) == f
    assert (f & f) == f


def test_combine_of_nothing_is_everything() -> None:
    assert Filter.combine([]).is_everything


def test_combine_rejects_what_is_not_a_filter() -> None:
    with pytest.raises(TypeError, match=r"walsvc\.Filter"):
        Filter.combine([Filter(), "vchannel a"])  # type: ignore[list-item]


def test_disjoint_vchannels_leave_only_broadcasts() -> None:
    f = Filter(vchannels=["a"]) & Filter(vchannels=["b"])
    assert f.vchannels == frozenset()
    assert f.admits(message(""))
    assert not f.admits(message("a"))
    assert not f.admits(message("b"))


def test_and_takes_the_higher_floor() -> None:
    assert (Filter(min_timetick=3) & Filter(min_timetick=7)).min_timetick == 7


# ---------------------------------------------------------------------------------------
# Value semantics


@given(filters)
def test_pickle_round_trip(f: Filter) -> None:
    copy = pickle.loads(pickle.dumps(f))
    assert copy == f
    assert hash(copy) == hash(f)
    assert copy.is_everything == f.is_everything
    for v in VCHANNELS:
        for t in TYPES:
            m = message(v, t, 5)
            assert copy.admits(m) == f.admits(m)
            assert admitted_by_prefilter(copy, m) == admitted_by_prefilter(f, m)


def test_equality_and_hash_ignore_order_and_spelling() -> None:
    a = Filter(vchannels=["a", "b"], types=[MessageType.INSERT, 3], min_timetick=2)
    b = Filter(vchannels=("b", "a", "a"), types={3, 2}, min_timetick=2)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != Filter(vchannels=["a"], types=[2, 3], min_timetick=2)
    assert a != Filter(vchannels=["a", "b"], types=[2, 3], min_timetick=3)
    assert a != "Filter"
    assert Filter(vchannels=None) != Filter(vchannels=[])


def test_repr_names_the_conditions() -> None:
    assert repr(Filter()) == "Filter()"
    text = repr(Filter(vchannels=["b", "a"], types=[2], min_timetick=4))
    assert text == "Filter(vchannels=['a', 'b'], types=[2], min_timetick=4)"


def test_filters_are_immutable() -> None:
    f = Filter(vchannels=["a"])
    with pytest.raises(AttributeError):
        f.extra = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"vchannels": "v1"}, id="vchannels-str"),
        pytest.param({"vchannels": b"v1"}, id="vchannels-bytes"),
        pytest.param({"vchannels": [1]}, id="vchannel-int"),
        pytest.param({"types": "INSERT"}, id="types-str"),
        pytest.param({"min_timetick": "5"}, id="min-timetick-str"),
    ],
)
def test_malformed_filters_are_rejected(kwargs: dict[str, object]) -> None:
    """A str is iterable: Filter(vchannels="v1") must not quietly mean {"v", "1"}."""
    with pytest.raises((TypeError, walsvc.InvalidArgument)):
        Filter(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Through a WAL: what a reader gets


async def test_reading_with_filters() -> None:
    async with await memory_wal() as wal:
        plan = [
            ("a", MessageType.INSERT),
            ("b", MessageType.INSERT),
            ("", MessageType.INSERT),
            ("a", MessageType.DELETE),
            ("b", MessageType.TIME_TICK),
            ("a", MessageType.BEGIN_TXN),
            ("a", MessageType.INSERT),
        ]
        # System types are the WAL's own, so they go straight to the backend here.
        first_tick = await wal.backend.last_timetick() + 1
        records = [
            encode(
                Message(payload=bytes([i]), vchannel=v, type=t),
                timetick=first_tick + i,
                term=wal.term,
            )
            for i, (v, t) in enumerate(plan)
        ]
        ids = await wal.backend.append(records)
        results = [walsvc.AppendResult(i, first_tick + n) for n, i in enumerate(ids)]
        floor = results[1].timetick
        scanner = wal.read(
            filters=[
                Filter(vchannels=["a"]),
                Filter(types=[MessageType.INSERT]),
                Filter(min_timetick=floor),
            ],
            use_cache=False,  # the records went behind the WAL's back, past its tail cache
        )
        async with scanner:
            got = [await anext(scanner) for _ in range(3)]
        # "a" INSERT before the floor is out; the broadcast, the system message on "a"
        # and the last "a" INSERT are in; "b" and the DELETE are out.
        assert [m.payload for m in got] == [bytes([2]), bytes([5]), bytes([6])]
        assert [m.message_id for m in got] == [results[i].message_id for i in (2, 5, 6)]
