"""Ids of the Kafka backend."""

from __future__ import annotations

from typing import final

from walsvc.core._ids import SequenceMessageId

__all__ = ("KafkaMessageId",)


@final
class KafkaMessageId(SequenceMessageId, frozen=True, gc=False):
    """Position in a ``kafka://`` pchannel: the record's offset in its one-partition topic.

    Offsets are not dense from the reader's side: barriers and invalid records (a fenced
    writer's late batches) occupy offsets that no message carries."""

    scheme = "kafka"
