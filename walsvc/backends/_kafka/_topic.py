"""Creating and checking a pchannel's topic: exactly one partition, made explicitly.

Tansu deviation: a metadata request for an unknown topic creates it with several
partitions, so a topic is always created (or found to exist) before it is described.
"""

from __future__ import annotations

from typing import Any, Final

from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaError

from walsvc.core._errors import BackendUnavailable, InvalidArgument

__all__ = ("check_partitions", "ensure_topic", "topic_exists")

_TOPIC_EXISTS: Final = 36


async def topic_exists(admin: Any, topic: str) -> bool:
    """Whether ``topic`` exists (listing topics never creates one)."""
    try:
        return topic in await admin.list_topics()
    except KafkaError as exc:
        raise BackendUnavailable(f"cannot list Kafka topics: {exc!r}") from exc


async def ensure_topic(admin: Any, topic: str, max_bytes: int) -> None:
    """Create ``topic`` with one partition unless it exists; refuse an existing topic
    with more than one partition (``InvalidArgument``).

    ``max.message.bytes`` is set to ``max_bytes`` (the largest batch the writer sends);
    a broker that refuses the setting gets the topic without it.
    """
    try:
        for configs in ({"max.message.bytes": str(max_bytes)}, {}):
            response = await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=configs)])
            (_, code, message) = response.topic_errors[0][:3]
            if code in (0, _TOPIC_EXISTS):
                break
        else:
            raise BackendUnavailable(f"cannot create Kafka topic {topic}: {code} {message}")
    except KafkaError as exc:
        raise BackendUnavailable(f"cannot create Kafka topic {topic}: {exc!r}") from exc
    await check_partitions(admin, topic)


async def check_partitions(admin: Any, topic: str) -> None:
    """Refuse an existing topic with other than one partition (``InvalidArgument``)."""
    try:
        (description,) = await admin.describe_topics([topic])
    except KafkaError as exc:
        raise BackendUnavailable(f"cannot describe Kafka topic {topic}: {exc!r}") from exc
    partitions = len(description["partitions"])
    if partitions != 1:
        raise InvalidArgument(
            f"Kafka topic {topic} has {partitions} partitions; a walsvc pchannel needs a"
            " topic with exactly one (delete it, or pick another topic_prefix)"
        )
