"""How walsvc records sit in Pulsar messages, and the chain rule that makes them valid.

A data message carries the envelope's payload as its data and the rest of the envelope
(fixed header, vchannel, ext section) in the property ``walsvc.h`` (latin-1 text, so
every byte survives as one character). Two more properties chain it into the log:

- ``walsvc.prev``: the marshalled id of the message that must precede the message's
  *group* in the log (the writer's previous message, or its barrier);
- ``walsvc.grp``: ``"TERM.SEQ.INDEX.COUNT"``: the group (one batch the writer sent at
  once) and the message's place in it.

A barrier (property ``walsvc.barrier``, no data) opens a writer's term; its position in
the log *is* the term (see ``term_of_barrier``), so a later barrier always means a newer
writer. Its property ``walsvc.writer`` names the writer's pid and host (``_identity``;
best effort, only for the error of the writer it fences; older barriers lack it).

The chain rule (``ChainValidator``): a group is valid iff its first message directly
follows the message named by ``walsvc.prev`` and all its members follow it contiguously;
a partial group, a group after a foreign message, and every barrier are dropped. Every
reader (scanner, tail tracker, writer's own check) applies this rule, so all agree.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from typing import Any, Final, NamedTuple, final

from walsvc.backends._identity import WRITER
from walsvc.core._errors import CorruptRecord

from ._ids import PulsarMessageId

__all__ = (
    "BARRIER",
    "SEAL",
    "ChainValidator",
    "Link",
    "data_properties",
    "foreign",
    "parse",
    "split_envelope",
    "term_of_barrier",
)

BARRIER: Final = "walsvc.barrier"
PREV: Final = "walsvc.prev"
GROUP: Final = "walsvc.grp"
HEAD: Final = "walsvc.h"
#: The marker property of a seal: member 0 of a group of two whose member 1 is never
#: written (see ``_writer``; readers drop seals by the chain rule, not by it).
SEAL: Final = "walsvc.seal"

_LENGTHS = struct.Struct("<12xH18xI")  # vchannel length at 12, ext length at 32
_TIMETICK = struct.Struct("<16xQ")
_HEADER_SIZE: Final = 36


def term_of_barrier(barrier: PulsarMessageId) -> int:
    """The term a barrier at this position gives its writer: increasing with the
    position, so the newest barrier in the log always has the greatest term."""
    if not (0 <= barrier.ledger < 2**31 and 0 <= barrier.entry < 2**32 - 1):
        raise CorruptRecord(f"barrier position {barrier!r} does not fit a 63-bit term")
    return (barrier.ledger << 32) + barrier.entry + 1


def split_envelope(envelope: bytes) -> tuple[str, bytes]:
    """(the envelope without its payload as latin-1 text, the payload)."""
    vc_len, ext_len = _LENGTHS.unpack_from(envelope)
    cut = _HEADER_SIZE + vc_len + ext_len
    return envelope[:cut].decode("latin-1"), envelope[cut:]


def data_properties(head: str, prev: str, group: str, member: int, members: int) -> dict[str, str]:
    """The properties of the ``member``-th of the ``members`` data messages of a group."""
    return {HEAD: head, PREV: prev, GROUP: f"{group}.{member}.{members}"}


@final
class Link(NamedTuple):
    """One message as read from the topic, with its chain properties parsed."""

    id: PulsarMessageId
    barrier: bool
    prev: PulsarMessageId | None
    group: str
    member: int
    members: int
    head: bytes
    data: bytes
    #: For a barrier, its ``walsvc.writer`` property as stored ("" if it has none).
    writer: str = ""
    #: Whether the message is a seal (it carries ``walsvc.seal``).
    sealed: bool = False

    @property
    def leaves_group_open(self) -> bool:
        """Whether more members of this message's group follow it in a log its writer
        finished writing (never after a seal, whose group of two stays open for good)."""
        return self.member < self.members - 1 and not self.sealed

    @property
    def timetick(self) -> int:
        """The envelope's timetick (0 for a barrier or a foreign message)."""
        if not self.head:
            return 0
        tick: int = _TIMETICK.unpack_from(self.head)[0]
        return tick


def parse(message: Any, message_id: PulsarMessageId) -> Link:
    """The ``Link`` of a received ``pulsar.Message`` stored at ``message_id``;
    ``CorruptRecord`` if it is not a walsvc record."""
    properties: Mapping[str, str] = message.properties()
    if BARRIER in properties:
        return Link(message_id, True, None, "", 0, 1, b"", b"", properties.get(WRITER, ""))
    try:
        head = properties[HEAD].encode("latin-1")
        prev_text = properties[PREV]
        group, _, tail = properties[GROUP].rpartition(".")
        count = int(tail)
        group, _, index_text = group.rpartition(".")
        index = int(index_text)
        prev = _prev_id(prev_text)
    except (KeyError, ValueError, UnicodeEncodeError, CorruptRecord) as exc:
        raise CorruptRecord(
            f"Pulsar message {message_id!r} is not a walsvc record ({type(exc).__name__}: {exc})"
        ) from None
    if len(head) < _HEADER_SIZE or not (0 <= index < count):
        raise CorruptRecord(f"Pulsar message {message_id!r} has a malformed walsvc header")
    return Link(
        message_id, False, prev, group, index, count, head, message.data(), "", SEAL in properties
    )


@functools.lru_cache(maxsize=256)
def _prev_id(text: str) -> PulsarMessageId:
    """The id in a ``walsvc.prev`` property (every member of a group carries the same
    text, so a scan parses each once)."""
    return PulsarMessageId.from_position(text.removeprefix("pulsar:"))


def foreign(message_id: PulsarMessageId) -> Link:
    """The link of a message that is not a walsvc record: never valid, and whatever
    follows it does not follow its writer's previous message."""
    return Link(message_id, False, None, "", 0, 1, b"", b"")


@final
class ChainValidator:
    """Applies the chain rule to messages pushed in log order; ``push`` returns the
    messages it makes valid (whole groups, in log order).

    ``pred`` is the id of the last message pushed (None before the first); a validator
    started in the middle of a log treats its first message as an anchor only.
    """

    __slots__ = ("pending", "pred")

    def __init__(self, pred: PulsarMessageId | None = None) -> None:
        self.pred = pred
        self.pending: list[Link] = []

    def push(self, link: Link) -> list[Link]:
        """Feed the next message of the log; return the group it completes, if any."""
        pred, self.pred = self.pred, link.id
        pending = self.pending
        if link.barrier:
            pending.clear()
            return []
        if link.member == 0:
            if link.prev != pred:
                pending.clear()
                return []
            self.pending = pending = [link]
        elif (
            pending
            and pending[-1].group == link.group
            and pending[-1].member == link.member - 1
            and pending[0].prev == link.prev
        ):
            pending.append(link)
        else:
            pending.clear()
            return []
        if len(pending) == link.members:
            self.pending = []
            return pending
        return []
