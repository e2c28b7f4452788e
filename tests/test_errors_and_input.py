"""Bad input gets a typed error whose message says what was wrong; message ids behave as
totally ordered, hashable, marshallable values."""

from __future__ import annotations

import inspect
import re
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import walsvc
from walsvc import (
    BackendUnavailable,
    CorruptRecord,
    DeliverPolicy,
    InvalidArgument,
    InvalidMessage,
    Message,
    MessageTooLarge,
    MessageType,
    UnknownBackend,
    WALClosed,
    WALError,
    WALFenced,
    WALReadOnly,
    unmarshal_message_id,
)
from walsvc.backends import _registry
from walsvc.backends._memory import MemoryMessageId
from walsvc.core._encode import encode
from walsvc.testing import memory_wal


def open_bare(*args: Any, **kwargs: Any) -> Awaitable[walsvc.WAL]:
    """A bare WAL (no interceptors): the log holds exactly what the test appends, with no
    TimeTicks, because these tests are about the backend underneath."""
    kwargs.setdefault("interceptors", [])
    return walsvc.open_wal(*args, **kwargs)


def fresh_url() -> str:
    return f"memory://{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------
# InvalidMessage: checked when the message is built, before it reaches any WAL


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"payload": "text"}, "payload must be bytes, not str"),
        ({"payload": bytearray(b"x")}, "payload must be bytes, not bytearray"),
        ({"payload": memoryview(b"x")}, "payload must be bytes, not memoryview"),
        ({"payload": None}, "payload must be bytes, not NoneType"),
        ({"vchannel": None}, "vchannel must be str, not NoneType"),
        ({"vchannel": b"v"}, "vchannel must be str, not bytes"),
        ({"vchannel": "x" * 65_536}, "vchannel is longer than 65535"),
        ({"vchannel": "\u00e9" * 40_000}, "vchannel is longer than 65535"),
        ({"type": 0}, "type 0 is neither"),
        ({"type": 12}, "type 12 is neither"),
        ({"type": 9_999}, "type 9999 is neither"),
        ({"type": 65_536}, "type 65536 is neither"),
        ({"type": -1}, "type -1 is neither"),
        ({"type": "INSERT"}, "type 'INSERT' is neither"),
        ({"type": None}, "type None is neither"),
        ({"type": True}, "type True is neither"),
        ({"type": 2.0}, "type 2.0 is neither"),
        ({"properties": {"k": 1}}, "properties must map str to str"),
        ({"properties": {1: "v"}}, "properties must map str to str"),
        ({"properties": {"k": None}}, "properties must map str to str"),
        ({"properties": None}, "properties must be a mapping"),
        ({"properties": [("k", "v")]}, "properties must be a mapping"),
        ({"idempotency_key": 7}, "idempotency_key must be str or None"),
        ({"vchannel": "\ud800"}, "vchannel .*UTF-8"),
        ({"properties": {"\udc80": "v"}}, "properties .*UTF-8"),
        ({"properties": {"k": "\ud800"}}, "properties .*UTF-8"),
        ({"idempotency_key": "\ud800"}, "idempotency_key .*UTF-8"),
    ],
)
def test_invalid_message(kwargs: dict[str, Any], complaint: str) -> None:
    fields: dict[str, Any] = {"payload": b"p", "vchannel": "v", **kwargs}
    with pytest.raises(InvalidMessage, match=complaint):
        Message(**fields)


def test_valid_message_edges() -> None:
    assert Message(payload=b"", vchannel="").type is MessageType.INSERT
    assert Message(payload=b"", vchannel="", type=2).type is MessageType.INSERT
    app = Message(payload=b"", vchannel="", type=10_000).type
    assert app is MessageType(10_000)
    assert app.name == "APPLICATION_10000"
    assert Message(payload=b"", vchannel="", type=65_535).type == 65_535
    assert Message(payload=b"", vchannel="x" * 65_535).vchannel == "x" * 65_535


async def test_append_rejects_what_is_not_a_message() -> None:
    async with await memory_wal() as wal:
        opened_at = await wal.latest_message_id()  # the opening TimeTick
        with pytest.raises(TypeError, match=r"append takes walsvc.Message, not dict"):
            await wal.append({"payload": b"x", "vchannel": "v"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"not bytes"):
            await wal.append_many([b"x"])  # type: ignore[list-item]
        assert await wal.latest_message_id() == opened_at


def readme_appendable_types() -> tuple[set[str], set[str]]:
    """The types the docs' "Which types you append" (docs/getting-started.md) names as
    yours, and the ones it says walsvc refuses (the backticked upper-case names before and
    after "system types")."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "getting-started.md").read_text()
    start = text.index("- **Which types you append**")
    bullet = text[start : text.index("\n- **", start + 1)]
    yours, _, refused = bullet.partition("The system types")
    names = re.compile(r"`([A-Z][A-Z_]+)`")
    return set(names.findall(yours)), set(names.findall(refused))


async def test_readme_says_which_types_users_may_append() -> None:
    """The README lists every type: the ones append accepts, and the system types it
    refuses with InvalidMessage (their reasons are the README's)."""
    yours, refused = readme_appendable_types()
    assert yours | refused == {t.name for t in MessageType}
    assert refused == {t.name for t in walsvc.SYSTEM_TYPES}
    assert {t.name for t in walsvc.EXCLUSIVE_TYPES} <= yours
    async with await memory_wal() as wal:
        for name in sorted(yours):
            await wal.append(Message(payload=b"x", vchannel="v", type=MessageType[name]))
        await wal.append(Message(payload=b"x", vchannel="v", type=MessageType(10000)))
        for name in sorted(refused):
            message = Message(payload=b"x", vchannel="v", type=MessageType[name])
            with pytest.raises(InvalidMessage, match="written by the WAL itself"):
                await wal.append(message)
            with pytest.raises(InvalidMessage, match="written by the WAL itself"):
                await wal.append_many([message])


# ---------------------------------------------------------------------------------------
# MessageTooLarge: nothing is written


async def test_message_too_large_writes_nothing() -> None:
    async with await memory_wal(max_message_size=1024, interceptors=[]) as wal:
        with pytest.raises(MessageTooLarge, match=r"exceeds max_message_size 1024") as info:
            await wal.append(Message(payload=bytes(2000), vchannel="v"))
        assert "2000" in str(info.value)
        # Small payload, large properties: the encoded size counts.
        with pytest.raises(MessageTooLarge, match=r"encoded message of .* bytes exceeds"):
            await wal.append(Message(payload=b"", vchannel="v", properties={"k": "v" * 2000}))
        # A bare batch: the envelope (header, vchannel) counts too.
        with pytest.raises(MessageTooLarge, match=r"encoded message of 1025 bytes exceeds"):
            await wal.append_many([Message(payload=bytes(1024 - 36), vchannel="v")])
        # One too large in a batch: none of the batch is written.
        with pytest.raises(MessageTooLarge):
            await wal.append_many(
                [Message(payload=b"ok", vchannel="v"), Message(payload=bytes(5000), vchannel="v")]
            )
        assert await wal.latest_message_id() is None
        # The WAL still works, and the first message gets the first id.
        result = await wal.append(Message(payload=bytes(900), vchannel="v"))
        assert result.message_id == MemoryMessageId(0)
        assert await wal.latest_message_id() == MemoryMessageId(0)


async def test_message_at_the_limit_is_accepted() -> None:
    async with await memory_wal(max_message_size=1024, interceptors=[]) as wal:
        # Find the largest payload that fits, then one byte more must not.
        message = Message(payload=b"", vchannel="v")
        overhead = len(encode(message, timetick=1, term=1))
        await wal.append(Message(payload=bytes(1024 - overhead), vchannel="v"))
        with pytest.raises(MessageTooLarge):
            await wal.append(Message(payload=bytes(1025 - overhead), vchannel="v"))


# ---------------------------------------------------------------------------------------
# UnknownBackend


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("nosuch://x", r"no walsvc backend for scheme 'nosuch'; known: .*memory"),
        ("memory-x", r"'memory-x' is not a WAL URL \(expected scheme://location\)"),
        ("://x", "is not a WAL URL"),
        ("", "is not a WAL URL"),
        ("/var/lib/walsvc", "is not a WAL URL"),
    ],
)
async def test_unknown_backend(url: str, complaint: str) -> None:
    with pytest.raises(UnknownBackend, match=complaint):
        await open_bare(url, "p")


def test_unknown_scheme_in_a_marshalled_id() -> None:
    with pytest.raises(UnknownBackend, match=r"nosuch"):
        unmarshal_message_id("nosuch:5")


def test_missing_extra_names_the_pip_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in backend whose third-party dependency is missing: UnknownBackend saying
    which package is missing and which ``pip install`` fixes it."""
    module = "_walsvc_test_needs_extra"
    (tmp_path / f"{module}.py").write_text("import walsvc_test_dependency_that_is_absent\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(_registry._BUILTIN, "needsextra", (module, "needsextra"))
    with pytest.raises(UnknownBackend) as info:
        _registry.backend_class("needsextra")
    text = str(info.value)
    assert "walsvc_test_dependency_that_is_absent" in text
    assert "pip install 'walsvc[needsextra]'" in text
    assert isinstance(info.value.__cause__, ImportError)
    sys.modules.pop(module, None)


def test_missing_backend_module_is_not_blamed_on_an_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A built-in scheme whose module does not exist (a backend not written yet) must not
    send the user to ``pip install`` an extra that would not help."""
    monkeypatch.setitem(
        _registry._BUILTIN, "notyet", ("walsvc.backends._not_written_yet", "notyet")
    )
    with pytest.raises(UnknownBackend) as info:
        _registry.backend_class("notyet")
    assert "pip install" not in str(info.value)
    assert "notyet" in str(info.value)


def test_registered_backend_with_a_missing_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third-party backend whose own dependency is missing: UnknownBackend naming the
    module and the missing package (not a bare ImportError from deep inside)."""
    module = "_walsvc_test_third_party_backend"
    (tmp_path / f"{module}.py").write_text("import walsvc_test_client_library_that_is_absent\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(_registry._registered, "thirdparty", module)
    with pytest.raises(UnknownBackend) as info:
        _registry.backend_class("thirdparty")
    assert "walsvc_test_client_library_that_is_absent" in str(info.value)
    assert module in str(info.value)
    sys.modules.pop(module, None)


def test_backend_module_without_backend_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "_walsvc_test_no_backend_class"
    (tmp_path / f"{module}.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(_registry._registered, "noclass", module)
    with pytest.raises(UnknownBackend, match=r"backend_class"):
        _registry.backend_class("noclass")
    sys.modules.pop(module, None)


def test_registering_a_taken_scheme_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match=r"'memory' is already registered"):
        walsvc.register_backend("memory", "somewhere.else")
    assert {"memory", "file", "kafka", "pulsar"} <= set(walsvc.known_schemes())


# ---------------------------------------------------------------------------------------
# InvalidArgument


@pytest.mark.parametrize(
    "pchannel",
    ["", "-leading-dash", ".leading-dot", "has space", "a/b", "a\\b", "ü", "x" * 201, "a\n"],
)
async def test_bad_pchannel_names(pchannel: str) -> None:
    with pytest.raises(InvalidArgument, match=r"pchannel .* must be 1-200 characters"):
        await open_bare(fresh_url(), pchannel)


@pytest.mark.parametrize("pchannel", [None, 7, b"p"])
async def test_pchannel_must_be_str(pchannel: object) -> None:
    with pytest.raises(InvalidArgument, match=r"pchannel"):
        await open_bare(fresh_url(), pchannel)  # type: ignore[arg-type]


async def test_good_pchannel_names() -> None:
    for pchannel in ("a", "0", "A.b_c-d", "x" * 200):
        async with await open_bare(fresh_url(), pchannel) as wal:
            assert wal.pchannel == pchannel


@pytest.mark.parametrize("size", [0, 63, -1, "big", 1.5, None])
async def test_bad_max_message_size(size: object) -> None:
    with pytest.raises(InvalidArgument, match=r"max_message_size must be an int >= 64"):
        await open_bare(fresh_url(), "p", max_message_size=size)  # type: ignore[arg-type]


async def test_invalid_argument_is_a_value_error() -> None:
    assert issubclass(InvalidArgument, ValueError)
    with pytest.raises(ValueError, match=r"pchannel"):
        await open_bare(fresh_url(), "")


async def test_unknown_memory_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"unknown option.*for memory:// WALs: colour"):
        await open_bare(fresh_url(), "p", colour="blue")


async def test_bad_deliver_policy_and_filters() -> None:
    async with await memory_wal() as wal:
        with pytest.raises(TypeError, match=r"walsvc.DeliverPolicy"):
            wal.read("all")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"walsvc.Filter"):
            wal.read(filters=["v1"])  # type: ignore[list-item]


async def test_id_of_another_backend_is_rejected() -> None:
    class OtherId(walsvc.SequenceMessageId, frozen=True):
        scheme = "other"

    async with await memory_wal() as wal:
        await wal.append(Message(payload=b"", vchannel="v"))
        with pytest.raises(InvalidArgument, match=r"not a memory:// message id"):
            wal.read(DeliverPolicy.start_from(OtherId(0)))
        with pytest.raises(InvalidArgument, match=r"not a memory:// message id"):
            await wal.truncate(OtherId(0))


async def test_truncate_beyond_the_end_is_rejected() -> None:
    async with await memory_wal() as wal:
        await wal.append(Message(payload=b"", vchannel="v"))
        with pytest.raises(InvalidArgument, match=r"not appended yet"):
            await wal.truncate(MemoryMessageId(5))


# ---------------------------------------------------------------------------------------
# WALClosed, WALReadOnly, WALFenced


async def _call(call: Callable[[], Any]) -> None:
    outcome = call()
    if inspect.isawaitable(outcome):
        await outcome


async def test_calls_on_a_closed_wal_raise_wal_closed() -> None:
    wal = await memory_wal()
    result = await wal.append(Message(payload=b"", vchannel="v"))
    await wal.aclose()
    assert wal.closed
    message = Message(payload=b"", vchannel="v")
    calls: list[Callable[[], Any]] = [
        lambda: wal.append(message),
        lambda: wal.append_many([message]),
        lambda: wal.read(),
        lambda: wal.latest_message_id(),
        lambda: wal.truncate(result.message_id),
    ]
    for call in calls:
        with pytest.raises(WALClosed, match=r"is closed"):
            await _call(call)
    await wal.aclose()  # idempotent


async def test_scanner_of_a_closed_wal_raises_wal_closed() -> None:
    wal = await memory_wal()
    scanner = wal.read(DeliverPolicy.latest())
    await wal.aclose()
    with pytest.raises(WALClosed):
        await anext(scanner)


async def test_scanner_closed_by_its_owner_ends() -> None:
    async with await memory_wal() as wal:
        await wal.append_many([Message(payload=b"", vchannel="v")] * 3)
        scanner = wal.read()
        await anext(scanner)
        await scanner.aclose()
        assert [m async for m in scanner] == []
        await scanner.aclose()  # idempotent


async def test_read_only_wal_refuses_writes() -> None:
    url = fresh_url()
    async with await open_bare(url, "p") as writer:
        result = await writer.append(Message(payload=b"x", vchannel="v"))
    async with await open_bare(url, "p", read_only=True) as wal:
        assert wal.read_only
        assert wal.term == 0
        message = Message(payload=b"", vchannel="v")
        with pytest.raises(WALReadOnly, match=r"read-only"):
            await wal.append(message)
        with pytest.raises(WALReadOnly, match=r"read-only"):
            await wal.append_many([message])
        with pytest.raises(WALReadOnly, match=r"read-only"):
            await wal.truncate(result.message_id)
        assert await wal.latest_message_id() == result.message_id


async def test_fenced_writer_cannot_append() -> None:
    url = fresh_url()
    old = await open_bare(url, "p")
    acked = await old.append(Message(payload=b"old", vchannel="v"))
    async with await open_bare(url, "p") as new:
        assert new.term > old.term
        with pytest.raises(WALFenced, match=f"term {old.term} was fenced by term {new.term}"):
            await old.append(Message(payload=b"lost", vchannel="v"))
        with pytest.raises(WALFenced):
            await old.append_many([Message(payload=b"lost", vchannel="v")])
        await new.append(Message(payload=b"new", vchannel="v"))
        async with new.read() as scanner:
            got = [await anext(scanner) for _ in range(2)]
        assert [m.payload for m in got] == [b"old", b"new"]
        assert got[0].message_id == acked.message_id
        assert [m.term for m in got] == [old.term, new.term]
    await old.aclose()


async def test_fenced_writer_cannot_truncate() -> None:
    """Truncation is a write: a fenced writer must not drop what the new writer owns."""
    url = fresh_url()
    old = await open_bare(url, "p")
    acked = await old.append(Message(payload=b"old", vchannel="v"))
    async with await open_bare(url, "p"):
        with pytest.raises(WALFenced):
            await old.truncate(acked.message_id)
    await old.aclose()


# ---------------------------------------------------------------------------------------
# CorruptRecord through ids


@pytest.mark.parametrize(
    "text",
    ["garbage", "", ":", ":5", "memory:", "memory:abc", "memory:-1", "memory: 1", "memory:1.0"],
)
def test_unmarshal_garbage_is_corrupt(text: str) -> None:
    with pytest.raises(CorruptRecord, match=r"message id|message position"):
        unmarshal_message_id(text)


@pytest.mark.parametrize("text", ["memory:\u00b2", "memory:\u0663", "memory:\uff11"])
def test_unmarshal_non_ascii_digits_is_corrupt(text: str) -> None:
    """str.isdigit() admits superscripts and other scripts' digits; a position is ASCII."""
    with pytest.raises(CorruptRecord):
        unmarshal_message_id(text)


@given(st.text(max_size=30))
def test_unmarshal_never_raises_anything_untyped(text: str) -> None:
    try:
        message_id = unmarshal_message_id(text)
    except (CorruptRecord, UnknownBackend):
        return
    assert unmarshal_message_id(message_id.marshal()) == message_id


# ---------------------------------------------------------------------------------------
# The error tree


def _exported_errors() -> list[type[WALError]]:
    return [
        obj
        for name in walsvc.__all__
        if isinstance(obj := getattr(walsvc, name), type) and issubclass(obj, WALError)
    ]


def test_every_error_derives_from_one_root_and_only_unavailable_is_retriable() -> None:
    errors = _exported_errors()
    assert {e.__name__ for e in errors} >= {
        "WALError",
        "WALClosed",
        "WALFenced",
        "WALReadOnly",
        "WALTruncated",
        "CorruptRecord",
        "MessageTooLarge",
        "InvalidMessage",
        "InvalidArgument",
        "BackendUnavailable",
        "UnknownBackend",
    }
    for error in errors:
        assert error.retriable is (error is BackendUnavailable), error
        assert error.__doc__, error
        # Every walsvc error says on its face that it is one.
        assert issubclass(error, WALError)
    assert BackendUnavailable("x").retriable is True
    assert WALFenced("x").retriable is False


# ---------------------------------------------------------------------------------------
# MessageId


class _OtherId(walsvc.SequenceMessageId, frozen=True):
    scheme = "other"


@given(st.integers(0, 2**64), st.integers(0, 2**64))
def test_ids_are_totally_ordered_like_their_positions(a: int, b: int) -> None:
    x, y = MemoryMessageId(a), MemoryMessageId(b)
    assert (x < y) == (a < b)
    assert (x <= y) == (a <= b)
    assert (x > y) == (a > b)
    assert (x >= y) == (a >= b)
    assert (x == y) == (a == b)
    assert (hash(x) == hash(y)) or a != b


@given(st.integers(0, 2**64))
def test_id_marshal_round_trip(seq: int) -> None:
    message_id = MemoryMessageId(seq)
    text = message_id.marshal()
    assert text == f"memory:{seq}"
    again = unmarshal_message_id(text)
    assert again == message_id
    assert type(again) is MemoryMessageId
    assert hash(again) == hash(message_id)


def test_ids_are_usable_as_keys_and_sort() -> None:
    ids = [MemoryMessageId(s) for s in (3, 1, 2, 1)]
    assert sorted(ids) == [MemoryMessageId(s) for s in (1, 1, 2, 3)]
    assert len(set(ids)) == 3
    assert {MemoryMessageId(1): "x"}[MemoryMessageId(1)] == "x"
    assert repr(MemoryMessageId(4)) == "MemoryMessageId(4)"


def test_ids_are_immutable() -> None:
    message_id = MemoryMessageId(1)
    with pytest.raises(AttributeError):
        message_id.seq = 2  # type: ignore[misc]


def test_ids_of_different_backends_do_not_compare() -> None:
    mine, other = MemoryMessageId(1), _OtherId(1)
    for compare in (
        lambda: mine < other,
        lambda: mine <= other,
        lambda: mine > other,
        lambda: mine >= other,
    ):
        with pytest.raises(TypeError):
            compare()
    assert mine != other  # equality is defined (and False): ids of two logs differ


def test_message_types() -> None:
    assert MessageType.TIME_TICK == 1
    assert MessageType.TXN == 999
    assert MessageType.TIME_TICK.is_system
    assert not MessageType.INSERT.is_system
    assert MessageType.CREATE_COLLECTION.is_exclusive
    assert not MessageType.INSERT.is_exclusive
    assert MessageType(10_001) is MessageType(10_001)
    assert not MessageType(10_001).is_system
    with pytest.raises(ValueError, match=r"12"):
        MessageType(12)
    assert walsvc.APPLICATION_TYPES[0] == 10_000
    assert walsvc.APPLICATION_TYPES[-1] == 65_535
