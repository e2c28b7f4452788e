"""The append path's per-batch record (``AppendRecorder``, issue 24): what each of its
calls counts, how a coalesced batch's time is split into stages, and that the compiled
recorder (``walsvc/core/_cmetrics.c``) counts as the Python one does."""

from __future__ import annotations

from time import perf_counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from walsvc.core import _metrics

RECORDERS = [
    pytest.param(_metrics.AppendRecorder, id="compiled"),
    pytest.param(_metrics.PyAppendRecorder, id="python"),
]


def _new(recorder: type[_metrics.PyAppendRecorder]) -> _metrics.PyAppendRecorder:
    return recorder(_metrics.LATENCY_BUCKETS, _metrics.BATCH_BUCKETS)


def test_the_compiled_recorder_is_built() -> None:
    """``make test`` builds walsvc/core/_cmetrics.c, and a WAL's metrics record through it:
    the Python recorder costs about 1 us a call inside a busy append loop."""
    assert _metrics.AppendRecorder is not _metrics.PyAppendRecorder
    assert isinstance(_metrics.WALMetrics("p", "file"), _metrics.AppendRecorder)


@pytest.mark.parametrize("recorder", RECORDERS)
def test_the_clock_is_perf_counters(recorder: type[_metrics.PyAppendRecorder]) -> None:
    """Callers pass times read with ``time.perf_counter``: the recorder's own reads
    fall between two of them."""
    for _ in range(100):
        before = perf_counter()
        now = recorder.now()
        assert before <= now <= perf_counter()


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_batch_serialized_once_is_split_into_its_stages(
    recorder: type[_metrics.PyAppendRecorder],
) -> None:
    """Encode and commit from the serialization point, ack from its acknowledgement to
    the batch's end, the chain the rest: the four add up to the batch's time."""
    rec, first = _new(recorder), 1001
    token = rec.batch_started(first, 3)
    started = rec.now()
    encoded = started + 0.002
    rec.serialized(started, encoded, 3, first)
    rec.batch_ended(token)
    assert rec.append_messages == 3
    assert rec.append_batches.counts[_metrics.BATCH_BUCKETS.index(4.0)] == 1  # 3 in (2, 4]
    assert rec.append_seconds.count == 3  # once per message
    assert rec.encode_seconds.sum == pytest.approx(0.002)
    assert rec.ack_seconds.count == rec.chain_seconds.count == 1
    stages = sum(h.sum for h in (rec.encode_seconds, rec.stage_commit_seconds, rec.ack_seconds))
    assert rec.append_seconds.sum / 3 == pytest.approx(stages + rec.chain_seconds.sum)
    assert rec.batches_in_flight() == 0


@pytest.mark.parametrize("recorder", RECORDERS)
def test_a_batch_not_split_whole_is_counted_but_not_split(
    recorder: type[_metrics.PyAppendRecorder],
) -> None:
    """A batch that reached the serialization point twice (appended message by message),
    or never (its first message left out on the way down), has its time to append
    counted and no stages; the stages the serialization point measured count alone."""
    rec = _new(recorder)
    twice, never = rec.batch_started(7, 2), rec.batch_started(8, 2)
    now = rec.now()
    rec.serialized(now, now, 1, 7)
    rec.serialized(now, now, 1, 7)
    rec.serialized(now, now, 2, 99)  # a batch whose first message was replaced
    rec.batch_ended(twice)
    rec.batch_ended(never)
    assert rec.append_seconds.count == 4
    assert rec.ack_seconds.count == rec.chain_seconds.count == 0
    assert rec.encode_seconds.count == rec.stage_commit_seconds.count == 3
    assert rec.append_messages == 4


@pytest.mark.parametrize("recorder", RECORDERS)
def test_the_same_message_first_in_two_batches_is_the_later_ones(
    recorder: type[_metrics.PyAppendRecorder],
) -> None:
    rec = _new(recorder)
    earlier = rec.batch_started(5, 1)
    later = rec.batch_started(5, 1)
    now = rec.now()
    rec.serialized(now, now, 1, 5)
    rec.batch_ended(earlier)
    assert rec.ack_seconds.count == 0
    rec.batch_ended(later)
    assert rec.ack_seconds.count == 1


@pytest.mark.parametrize("recorder", RECORDERS)
def test_misuse_is_a_value_error(recorder: type[_metrics.PyAppendRecorder]) -> None:
    rec = _new(recorder)
    token = rec.batch_started(5, 1)
    rec.batch_ended(token)
    with pytest.raises(ValueError, match="not a batch in flight"):
        rec.batch_ended(token)
    with pytest.raises(ValueError, match="not a batch in flight"):
        rec.batch_ended(12345)
    with pytest.raises(ValueError, match="the id of a message"):
        rec.batch_started(0, 1)


def test_a_compiled_recorder_is_initialised_once() -> None:
    rec = _new(_metrics.AppendRecorder)
    with pytest.raises(RuntimeError, match="once"):
        rec.__init__(_metrics.LATENCY_BUCKETS, _metrics.BATCH_BUCKETS)  # type: ignore[misc]
    bare = _metrics.AppendRecorder.__new__(_metrics.AppendRecorder)
    with pytest.raises(ValueError, match="not initialised"):
        bare.committed(0.0, 1, 1, False)


#: One call: ("start", first, count), ("end", index of a started batch),
#: ("serialized", first, count) or ("committed", records, size, rolled_over).
_call = st.one_of(
    st.tuples(st.just("start"), st.integers(1, 4), st.integers(1, 300)),
    st.tuples(st.just("end"), st.integers(0, 20)),
    st.tuples(st.just("serialized"), st.integers(1, 5), st.integers(1, 300)),
    st.tuples(st.just("committed"), st.integers(1, 300), st.integers(0, 1 << 20), st.booleans()),
)


def _play(rec: _metrics.PyAppendRecorder, calls: list[tuple[Any, ...]]) -> None:
    """Make ``calls``, with latencies far from every bucket bound's neighbourhood
    (7 ms encode, 30 ms commit, the clock's own reads a few microseconds apart)."""
    started: list[int] = []
    for call in calls:
        if call[0] == "start":
            started.append(rec.batch_started(call[1], call[2]))
        elif call[0] == "end" and started:
            rec.batch_ended(started.pop(call[1] % len(started)))
        elif call[0] == "serialized":
            now = rec.now()
            rec.serialized(now - 0.007, now, call[2], call[1])
        elif call[0] == "committed":
            rec.committed(rec.now() - 0.03, call[1], call[2], call[3])
    for token in started:
        rec.batch_ended(token)


@given(st.lists(_call, max_size=60))
def test_the_compiled_recorder_counts_as_the_python_one(calls: list[tuple[Any, ...]]) -> None:
    """The same calls make the same counts in every histogram and counter (latencies
    differ by the clock's reads: their buckets are compared where the value is far from a
    bound)."""
    compiled, python = _new(_metrics.AppendRecorder), _new(_metrics.PyAppendRecorder)
    _play(compiled, calls)
    _play(python, calls)
    for name in ("append_messages", "written_bytes", "segment_rollovers"):
        assert getattr(compiled, name) == getattr(python, name), name
    for name in ("append_batches", "commit_records", "encode_seconds", "commit_seconds"):
        assert getattr(compiled, name).counts == getattr(python, name).counts, name
    for name in (
        "append_seconds",
        "stage_commit_seconds",
        "chain_seconds",
        "ack_seconds",
    ):
        assert getattr(compiled, name).count == getattr(python, name).count, name
    assert compiled.batches_in_flight() == python.batches_in_flight() == 0
