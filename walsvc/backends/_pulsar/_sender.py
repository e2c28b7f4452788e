"""Sending one group (or a seal) of the ``pulsar://`` writer through the C++ producer.

``send_group`` hands every message of a group to the producer without a Python future
per message (``GroupAcks`` wakes the event loop once, when the last result arrived) and
reads the results: the ids of a group sent whole; None if any send failed (the writer
then reads the log to find out what landed); ``Fenced`` if the broker fenced the
producer; ``TooBig`` naming the messages the client refused as larger than the broker's
maximum message size (``MessageTooBig``: such a message is batched alone, so the others
were sent). ``send_seal`` appends a seal (see ``_writer``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from pulsar import _pulsar

from ._client import PULSAR_ERRORS, GroupAcks, result_name, translate
from ._ids import PulsarMessageId
from ._records import SEAL, Link, data_properties, split_envelope

if TYPE_CHECKING:
    import pulsar.asyncio as pulsar_asyncio

__all__ = ("SLOW_ACKS", "Fenced", "TooBig", "contiguous", "send_group", "send_seal")

# A seal's envelope part: 36 zero bytes, a header with empty vchannel and ext sections
# and timetick 0 (tail trackers read the timetick of every data message).
_SEAL_HEAD: Final = "\0" * 36
#: A group whose sends are not all acknowledged after this many seconds is logged as a
#: warning (the wait goes on to the operation timeout): a broker that stopped answering.
SLOW_ACKS: Final = 5.0
#: How much longer than the operation timeout a group's acks are waited for (the
#: client's own send timeout reports a failed send before that).
_ACK_SLACK: Final = 5.0
_log = logging.getLogger("walsvc.pulsar")


class Fenced(Exception):
    """A newer writer's barrier lies between this writer's messages (``barrier``, when it
    was read), or the broker fenced the producer (``barrier`` None)."""

    def __init__(self, barrier: Link | None = None) -> None:
        super().__init__(barrier)
        self.barrier = barrier


class TooBig(Exception):
    """The client refused these members of a group (by index) as larger than the
    broker's maximum message size (``MessageTooBig``); the others were sent."""

    def __init__(self, indexes: list[int]) -> None:
        super().__init__(indexes)
        self.indexes = frozenset(indexes)


async def send_group(
    producer: pulsar_asyncio.Producer,
    topic: str,
    records: list[bytes],
    prev: PulsarMessageId,
    group: str,
    operation_timeout: float,
) -> list[PulsarMessageId] | None:
    """Send one group; its ids, or None if any send failed or was not answered within
    ``operation_timeout`` + 5 s. Raises ``Fenced``, ``TooBig``, or a translated error if the
    producer refused the sends outright (nothing was sent)."""
    prev_text = prev.marshal()
    count = len(records)
    acks = GroupAcks(count)
    inner = producer._producer
    try:
        for index, record in enumerate(records):
            head, payload = split_envelope(record)
            builder = _pulsar.MessageBuilder()
            builder.content(payload)
            for key, value in data_properties(head, prev_text, group, index, count).items():
                builder.property(key, value)
            inner.send_async(builder.build(), acks.callback(index))
        inner.flush_async(lambda result: None)
    except PULSAR_ERRORS as exc:
        raise translate(exc, f"sending to {topic} failed") from exc
    try:
        async with asyncio.timeout(operation_timeout + _ACK_SLACK):
            await _wait_for_acks(acks, topic, group, count, operation_timeout)
    except TimeoutError:
        return None
    failed = {
        index: result_name(result)
        for index, (result, _) in enumerate(acks.results)
        if result != _pulsar.Result.Ok
    }
    if "ProducerFenced" in failed.values():
        raise Fenced
    too_big = [index for index, name in failed.items() if name == "MessageTooBig"]
    if too_big:
        raise TooBig(too_big)
    if failed:
        return None
    return [PulsarMessageId.of(message_id) for _, message_id in acks.results]


async def _wait_for_acks(
    acks: GroupAcks, topic: str, group: str, count: int, operation_timeout: float
) -> None:
    """Until every send of ``group`` has its result; a warning if that takes more than
    ``SLOW_ACKS`` seconds."""
    watch = asyncio.get_running_loop().call_later(
        SLOW_ACKS, _warn_slow_acks, acks, topic, group, count, operation_timeout
    )
    try:
        await acks.wait()
    finally:
        watch.cancel()


def _warn_slow_acks(
    acks: GroupAcks, topic: str, group: str, count: int, operation_timeout: float
) -> None:
    _log.warning(
        "pulsar WAL of %s: %d of the %d sends of group %s not acknowledged after"
        " %.1f s (waiting up to %.1f s in all)",
        topic,
        acks.pending(),
        count,
        group,
        SLOW_ACKS,
        operation_timeout + _ACK_SLACK,
    )


async def send_seal(
    producer: pulsar_asyncio.Producer, end: PulsarMessageId, name: str, operation_timeout: float
) -> PulsarMessageId | None:
    """Append a seal (group ``name``) naming ``end`` as its predecessor; its id, or None
    if it failed. Raises ``Fenced`` if the broker fenced the producer."""
    builder = _pulsar.MessageBuilder()
    builder.content(b"")
    properties = data_properties(_SEAL_HEAD, end.marshal(), name, 0, 2)
    for key, value in {**properties, SEAL: "1"}.items():
        builder.property(key, value)
    acks = GroupAcks(1)
    inner = producer._producer
    try:
        inner.send_async(builder.build(), acks.callback(0))
        inner.flush_async(lambda result: None)
        async with asyncio.timeout(operation_timeout + _ACK_SLACK):
            await acks.wait()
    except (TimeoutError, *PULSAR_ERRORS):
        return None
    result, message_id = acks.results[0]
    if result != _pulsar.Result.Ok:
        if result_name(result) == "ProducerFenced":
            raise Fenced
        return None
    return PulsarMessageId.of(message_id)


def contiguous(prev: PulsarMessageId, ids: list[PulsarMessageId]) -> bool:
    """True if ``ids`` follow ``prev`` with nothing in between (common case only: one
    ledger; entries +1; batch indexes +1 inside an entry)."""
    before = prev
    for index, current in enumerate(ids):
        if current.ledger != before.ledger:
            return False
        if current.entry == before.entry:
            if index == 0 or current.batch != before.batch + 1:
                return False
        elif current.entry != before.entry + 1 or current.batch > 0:
            return False
        before = current
    return True
