"""``pulsar://HOST:PORT``: the Pulsar backend (needs the ``pulsar`` extra: pulsar-client).

Exposes ``backend_class`` for the registry, ``PulsarBackend`` and ``PulsarMessageId``.
"""

from ._backend import PulsarBackend
from ._ids import PulsarMessageId

__all__ = ("PulsarBackend", "PulsarMessageId", "backend_class")

backend_class = PulsarBackend
