"""``kafka://``: walsvc on Apache Kafka (and Kafka-protocol brokers) through aiokafka.

See ``_backend`` for the URL and options, ``_records`` for the record layout and
``_writer`` for the offset-chain fencing."""

from ._backend import KafkaBackend
from ._ids import KafkaMessageId

backend_class = KafkaBackend

__all__ = ("KafkaBackend", "KafkaMessageId", "backend_class")
