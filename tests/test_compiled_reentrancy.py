"""The compiled loops hold what they read while Python code runs.

Each loop of walsvc's C extensions reads items of a list (or a queue, a dict) and, for
each, may run Python code: an attribute that is a property, an id class's
``__post_init__``, a vchannel resolver, an ``__index__``. Code that changes the list meanwhile must
not make the loop read past its end or use an item it freed: a loop holds each item
while it works on it and raises ``RuntimeError`` if the list changed length under it (the
types walsvc itself passes run no such code; these are the guarantees against a user's).
Every case runs in a child with ``PYTHONMALLOC=debug``, where a read of freed memory
crashes instead of passing unseen; before the fix each one crashed (SIGSEGV) or hung.

The committer's ``close`` from two threads at once joins its thread once: the second
returns at once instead of joining a thread that may be gone (undefined behaviour).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import walsvc

HANG = 60.0  # a guard against hangs, never a timing assertion

#: A batch of messages whose idempotency key, when read, empties the batch.
_KEY_EMPTIES_THE_BATCH = """
    from interceptors import _cshards
    batch = []
    class Evil:
        vchannel = "v"
        txn = None
        @property
        def idempotency_key(self):
            batch.clear()
            return "p.1"
    batch.extend([Evil(), Evil(), Evil()])
    try:
        _cshards.{loop}(batch)
    except RuntimeError as exc:
        print(exc)
    """

#: An id class whose construction empties the list ``box[0]`` (the wires being read);
#: indented as the cases it starts.
_ID_CLASS_EMPTIES_THE_LIST = """
        from walsvc.backends._memory import MemoryMessageId
        from walsvc.remote._client import _cclient, _Ids
        from walsvc.remote._protocol import WireDelivered, WireResult
        box = []
        class Evil(MemoryMessageId, frozen=True, gc=False):
            scheme = "evil"
            def __post_init__(self):
                if box:
                    box[0].clear()
        classes = {"evil": Evil}
"""

_CASES = {
    "window_keys: a key property empties the batch": _KEY_EMPTIES_THE_BATCH.format(
        loop="window_keys"
    ),
    "counted_run: a key property empties the batch": _KEY_EMPTIES_THE_BATCH.format(
        loop="counted_run"
    ),
    "evict_settled: a timetick property empties the queue": """
        from interceptors import _cshards
        order, slots = _cshards.KeyQueue(), _cshards.ShardedDict()
        class Settled:
            @property
            def timetick(self):
                order.popleft()
                return 0
        slots["k"] = Settled()
        order.append("k")
        print(_cshards.evict_settled(order, slots, 0, 10, Settled), "k" in slots)
        """,
    "spans_hold: an __index__ empties the spans": """
        from interceptors import _cshards
        spans = {}
        class Low:
            def __index__(self):
                spans.clear()
                return 0
        spans["p."] = (Low(), int("1000012345"))
        print(_cshards.spans_hold(["v\\0p.a"], spans))
        """,
    "encode_plain_batch: the resolver empties the batch": """
        from walsvc.core import _encode, _speedups
        from walsvc.core._message import Message
        batch = [Message(payload=b"x", vchannel=f"v{i}") for i in range(100)]
        def resolve(vchannel):
            batch.clear()
            return _encode._vchannel_entry(vchannel)
        try:
            _speedups.encode_plain_batch(batch, 1, 1, b"", 1 << 20, {}, resolve)
        except RuntimeError as exc:
            print(exc)
        """,
    "results_of: an id class empties the results it is made from": _ID_CLASS_EMPTIES_THE_LIST
    + """
        wires = [WireResult("evil:" + str(7), int("1" * 40), None)]
        box.append(wires)
        (result,) = _cclient.results_of(wires, classes, _Ids(classes))
        print(result.message_id.seq, result.timetick == int("1" * 40))
        """,
    "delivered_of: an id class empties the messages it is made from": _ID_CLASS_EMPTIES_THE_LIST
    + """
        wires = [
            WireDelivered(
                "evil:" + str(7), int("1" * 40), "v" + str(1), 2, b"p" * 3,
                {"a" + str(1): "b"}, None, None, None, 1, True, -1, [],
            )
        ]
        box.append(wires)
        (message,) = _cclient.delivered_of(wires, classes, _Ids(classes))
        print(message.message_id.seq, message.vchannel, message.payload, dict(message.properties))
        """,
    "Committer.close from two threads at once": """
        import fcntl, os, tempfile, threading, time
        from walsvc.backends._file import _ccommit
        from walsvc.backends._file._head import HeadFile, HeadState
        d = tempfile.mkdtemp()
        HeadFile(d + "/head", writable=True).write(HeadState(7, 0, 0, 0, 0, 0), sync=False)
        head = os.open(d + "/head", os.O_RDWR)
        data = os.open(d + "/seg", os.O_RDWR | os.O_CREAT)
        blocker = os.open(d + "/head", os.O_RDWR)
        fcntl.flock(blocker, fcntl.LOCK_EX)  # holds the batch in the committer's thread
        committer = _ccommit.Committer(head, 7, os.eventfd(0), 5.0)
        committer.commit(data, b"A" * 4096, 0, False, 1, 1, 0)
        closes = [threading.Thread(target=committer.close) for _ in range(2)]
        for close in closes:
            close.start()
        time.sleep(0.3)  # both closes are in: one joins the thread, one must not
        fcntl.flock(blocker, fcntl.LOCK_UN)
        for close in closes:
            close.join(20)
        print([close.is_alive() for close in closes], os.pread(data, 4096, 0) == b"A" * 4096)
        """,
}

_EXPECTED = {
    "window_keys: a key property empties the batch": "the messages changed while they were read",
    "counted_run: a key property empties the batch": "the messages changed while they were read",
    "evict_settled: a timetick property empties the queue": "-1 True",
    "spans_hold: an __index__ empties the spans": "True",
    "encode_plain_batch: the resolver empties the batch": "the batch changed while it was encoded",
    "results_of: an id class empties the results it is made from": "7 True",
    "delivered_of: an id class empties the messages it is made from": "7 v1 b'ppp' {'a1': 'b'}",
    "Committer.close from two threads at once": "[False, False] True",
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_compiled_loop_survives_python_code_that_changes_what_it_reads(case: str) -> None:
    root = str(Path(walsvc.__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CASES[case])],
        env={**os.environ, "PYTHONPATH": root, "PYTHONMALLOC": "debug"},
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
    )
    assert (result.returncode, result.stdout.strip()) == (0, _EXPECTED[case]), result.stderr
