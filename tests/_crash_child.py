"""Child processes for the file-backend crash and cross-process tests (see
``test_file_crash.py``), and the message model they share with the parent test.

Run as ``python _crash_child.py MODE ...``:

- ``write DIR ROUND SEED PRODUCERS SEGMENT_SIZE TRUNCATE_TO``: open ``file://DIR``
  read-write with ``sync="always"`` and append from ``PRODUCERS`` concurrent producers until
  killed, printing one line per acknowledged message. If ``TRUNCATE_TO`` >= 0, one task
  truncates through that id at a random moment, announcing it before and after.
- ``read DIR``: open ``file://DIR`` read-only and print every message it reads, checking
  each against ``expected_message``; runs until killed.
- ``append DIR COUNT``: open read-write (fencing the previous writer), append ``COUNT``
  messages, print their ids, then wait for a line on stdin before closing.

Every line is written and flushed as soon as its event happened, so a line the parent read
means the event happened before the child died. Lines::

    OPENING                                  about to call open_wal
    READY term                               open_wal returned
    A round producer seq id timetick         an append was acknowledged
    T id / TD id                             truncating through id / done
    M id timetick round producer seq         (reader) a message was read
    BAD id reason                            (reader) a message is not what was written
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Awaitable
from typing import Any

import walsvc
from walsvc import DeliverPolicy, Message, MessageType


def open_bare(*args: Any, **kwargs: Any) -> Awaitable[walsvc.WAL]:
    """A bare WAL (no interceptors): the log holds exactly what the test appends, with no
    TimeTicks, because these tests are about the backend underneath."""
    kwargs.setdefault("interceptors", [])
    return walsvc.open_wal(*args, **kwargs)


PCHANNEL = "crash"
#: The producer number of messages the parent test appends between rounds.
PARENT = 99
_TYPES = (MessageType.INSERT, MessageType.DELETE, MessageType(10_007))


def expected_message(round_: int, producer: int, seq: int) -> Message:
    """The message ``producer`` appends as its ``seq``-th of round ``round_``: a function
    of the three numbers only, so a reader can tell a message is intact from its content.
    Padding lengths vary widely so frames vary in size and some are several segments big.
    """
    rnd = random.Random(f"{round_}/{producer}/{seq}")
    roll = rnd.random()
    if roll < 0.02:
        size = rnd.randrange(64 * 1024, 160 * 1024)
    elif roll < 0.2:
        size = rnd.randrange(2048, 16 * 1024)
    else:
        size = rnd.randrange(0, 1500)
    payload = f"{round_}:{producer}:{seq}:".encode() + rnd.randbytes(size)
    properties = {"r": str(round_), "p": str(producer), "s": str(seq)}
    if rnd.random() < 0.3:
        properties["note"] = "é" * rnd.randrange(1, 40)
    return Message(
        payload=payload,
        vchannel=f"v{producer}",
        type=_TYPES[seq % len(_TYPES)],
        properties=properties,
    )


def check_message(message: walsvc.ImmutableMessage) -> tuple[int, int, int]:
    """(round, producer, seq) of a message read back; AssertionError if it is not exactly
    what ``expected_message`` gives for those numbers."""
    props = message.properties
    key = (int(props["r"]), int(props["p"]), int(props["s"]))
    want = expected_message(*key)
    got = (message.payload, message.vchannel, message.type, dict(message.properties))
    wanted = (want.payload, want.vchannel, want.type, dict(want.properties))
    if got != wanted:
        raise AssertionError(f"{message.message_id}: content differs from what {key} wrote")
    return key


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _write(
    directory: str, round_: int, seed: int, producers: int, segment_size: int, truncate_to: int
) -> None:
    rng = random.Random(seed)
    _say("OPENING")
    wal = await open_bare(f"file://{directory}", PCHANNEL, sync="always", segment_size=segment_size)
    _say(f"READY {wal.term}")

    async def produce(producer: int) -> None:
        batchy = producer % 2 == 0
        prng = random.Random(rng.random())
        seq = 0
        while True:
            count = prng.randint(1, 4) if batchy else 1
            messages = [expected_message(round_, producer, seq + i) for i in range(count)]
            if batchy:
                results = await wal.append_many(messages)
            else:
                results = [await wal.append(messages[0])]
            for i, result in enumerate(results):
                _say(f"A {round_} {producer} {seq + i} {result.message_id.seq} {result.timetick}")
            seq += count

    async def truncate() -> None:
        await asyncio.sleep(rng.uniform(0, 0.15))
        _say(f"T {truncate_to}")
        await wal.truncate(walsvc.unmarshal_message_id(f"file:{truncate_to}"))
        _say(f"TD {truncate_to}")

    tasks = [asyncio.ensure_future(produce(p)) for p in range(producers)]
    if truncate_to >= 0:
        tasks.append(asyncio.ensure_future(truncate()))
    # Runs until the parent kills it; the timeout only stops an orphan.
    await asyncio.wait_for(asyncio.gather(*tasks), 60)


async def _read(directory: str) -> None:
    wal = await open_bare(f"file://{directory}", PCHANNEL, read_only=True, poll_interval=0.005)
    _say("READY 0")
    async with wal.read(DeliverPolicy.all()) as scanner:
        async for message in scanner:
            try:
                r, p, s = check_message(message)
            except (AssertionError, KeyError, ValueError) as exc:
                _say(f"BAD {message.message_id.seq} {exc!r}")
                continue
            _say(f"M {message.message_id.seq} {message.timetick} {r} {p} {s}")


async def _append(directory: str, count: int) -> None:
    async with await open_bare(f"file://{directory}", PCHANNEL) as wal:
        _say(f"READY {wal.term}")
        for seq in range(count):
            result = await wal.append(expected_message(-1, PARENT, seq))
            _say(f"A -1 {PARENT} {seq} {result.message_id.seq} {result.timetick}")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def main(argv: list[str]) -> None:
    mode, directory, *rest = argv
    if mode == "write":
        round_, seed, producers, segment_size, truncate_to = map(int, rest)
        asyncio.run(_write(directory, round_, seed, producers, segment_size, truncate_to))
    elif mode == "read":
        asyncio.run(_read(directory))
    elif mode == "append":
        asyncio.run(_append(directory, int(rest[0])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
