"""The client's compiled answer path (``_cclient.results_of`` in
``walsvc/remote/_cclient.c``) turns the node's ``WireResult``s into the ``AppendResult``s
``RemoteWAL._result`` makes: the same ids, of the same classes, the same objects shared
where ``_Ids`` shares them, and the same last-confirmed id cache left behind. What it
does not take it declines (None), and the Python path then parses it or raises what it
raises. (How the requests are written: ``test_append_request_encoding``; how the node
writes its answers: ``test_append_answer_encoding``.)"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest
from _append_support import INT64, outcome, plain, run, wal_append_many
from hypothesis import given
from hypothesis import strategies as st

from walsvc.backends._file._ids import FileMessageId
from walsvc.backends._kafka._ids import KafkaMessageId
from walsvc.backends._memory import MemoryMessageId
from walsvc.backends._pulsar._ids import PulsarMessageId
from walsvc.core._errors import CorruptRecord
from walsvc.core._message import AppendResult
from walsvc.remote import _client
from walsvc.remote._protocol import WireResult

_cclient = _client._cclient


_SEQUENCES: dict[str, type[Any]] = {
    "file": FileMessageId,
    "memory": MemoryMessageId,
    "kafka": KafkaMessageId,
}
# Up to 19 digits (more: the Python path parses them).
_POSITIONS = st.integers(min_value=0, max_value=10**19 - 1) | st.sampled_from(
    [0, 9, 10, 2**31, 2**62, 2**63 - 1, 2**63, 10**18, 10**19 - 1]
)


def _wire_results() -> st.SearchStrategy[list[WireResult]]:
    scheme = st.sampled_from(list(_SEQUENCES))
    lcs = st.none() | st.sampled_from(["{s}:0", "{s}:7", "{s}:9223372036854775807"])

    def results(s: str) -> st.SearchStrategy[list[WireResult]]:
        return st.lists(
            st.builds(
                lambda position, tick, lc: WireResult(
                    f"{s}:{position}", tick, None if lc is None else lc.format(s=s)
                ),
                _POSITIONS,
                INT64,
                lcs,
            ),
            max_size=20,
        )

    return scheme.flatmap(results)


def _parsers(seed: str | None = None) -> tuple[_client._Ids, _client._Ids]:
    """An id parser and a last-confirmed id parser that know the sequence schemes (and
    have parsed ``seed`` last)."""
    ids = _client._Ids(dict(_SEQUENCES))
    lc_ids = _client._Ids(ids.sequences)
    if seed is not None:
        lc_ids(seed)
    return ids, lc_ids


def _python_results(
    wires: list[WireResult], ids: _client._Ids, lc_ids: _client._Ids
) -> list[AppendResult]:
    """``RemoteWAL._result`` of each, with these parsers."""
    return [
        AppendResult(
            ids(w.message_id),
            w.timetick,
            None if w.last_confirmed_id is None else lc_ids(w.last_confirmed_id),
        )
        for w in wires
    ]


def _shared(results: list[AppendResult]) -> list[bool]:
    """Which results share their last-confirmed id object with the one before."""
    return [
        a.last_confirmed_id is not None and a.last_confirmed_id is b.last_confirmed_id
        for a, b in itertools.pairwise(results)
    ]


@given(_wire_results(), st.sampled_from([None, "memory:7", "file:0", "kafka:5"]))
def test_the_compiled_results_are_the_python_results(
    wires: list[WireResult], seed: str | None
) -> None:
    ids, lc_ids = _parsers(seed)
    seeded = lc_ids._last
    compiled = _cclient.results_of(wires, ids.sequences, lc_ids)
    python_ids, python_lc_ids = _parsers(seed)
    python_seeded = python_lc_ids._last
    expected = _python_results(wires, python_ids, python_lc_ids)
    assert compiled == expected
    assert [type(r.message_id) for r in compiled] == [type(r.message_id) for r in expected]
    # the same objects shared as _Ids shares them, and the same cache left behind
    assert _shared(compiled) == _shared(expected)
    assert [r.last_confirmed_id is seeded for r in compiled] == [
        r.last_confirmed_id is python_seeded for r in expected
    ]
    assert (lc_ids._last_text, lc_ids._last) == (python_lc_ids._last_text, python_lc_ids._last)


def test_a_repeated_last_confirmed_id_is_one_object_across_calls() -> None:
    ids, lc_ids = _parsers("file:3")
    seeded = lc_ids._last
    first = _cclient.results_of(
        [WireResult("file:5", 1, "file:3"), WireResult("file:6", 2, "file:3")],
        ids.sequences,
        lc_ids,
    )
    assert first is not None
    assert first[0].last_confirmed_id is seeded
    assert first[1].last_confirmed_id is seeded
    moved = _cclient.results_of([WireResult("file:7", 3, "file:6")], ids.sequences, lc_ids)
    assert moved is not None
    assert lc_ids._last is moved[0].last_confirmed_id
    assert lc_ids._last_text == "file:6"
    again = _cclient.results_of([WireResult("file:8", 4, "file:6")], ids.sequences, lc_ids)
    assert again is not None
    assert again[0].last_confirmed_id is moved[0].last_confirmed_id
    assert [r.last_confirmed_id for r in (*first, *moved)] == [
        FileMessageId(3),
        FileMessageId(3),
        FileMessageId(6),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "pulsar:1:2:-1:-1",  # not a sequence id: the Python path parses it
        "nosuch:5",  # a scheme not in the classes
        "memory:12a",
        "memory:",
        "memory:-1",
        "memory:+1",
        "memory: 1",
        "memory:1_0",
        "memory:\u0663",  # an Arabic-Indic digit: isdigit, not ASCII
        "memory:\u00b2",
        "memory5",
        ":5",
        "memory:12345678901234567890",  # 20 digits: Python takes the longer number
    ],
)
@pytest.mark.parametrize("where", ["message_id", "last_confirmed_id"])
def test_what_results_of_declines_goes_the_python_way(text: str, where: str) -> None:
    """Declined (None), the Python ``_result`` raises ``CorruptRecord`` for a bad
    position, ``UnknownBackend`` for an unknown scheme, or parses what it can."""
    good = WireResult("memory:1", 1, "memory:0")
    bad = msgspec.structs.replace(good, **{where: text})
    ids, lc_ids = _parsers()
    assert _cclient.results_of([good, bad], ids.sequences, lc_ids) is None
    assert lc_ids._last is None  # the cache moves only with results it gave
    expected = outcome(lambda: _python_results([good, bad], *_parsers()))
    if text.startswith("memory") and not text.startswith("memory:1234"):
        assert isinstance(expected, tuple)
        assert expected[0] is CorruptRecord
    batch = [plain(), plain()]
    assert outcome(lambda: run(wal_append_many(batch, answer=[good, bad])).results) == expected


def test_ids_of_classes_with_their_own_parsing_are_not_learned() -> None:
    """The Python parser teaches the compiled path the sequence classes only."""
    ids, _ = _parsers()
    ids.sequences.clear()
    ids("memory:4")
    ids(PulsarMessageId(1, 2, -1).marshal())
    assert ids.sequences == {"memory": MemoryMessageId}
