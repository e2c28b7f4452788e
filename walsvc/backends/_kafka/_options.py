"""The ``kafka://`` URL and the backend's keyword options, validated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from walsvc.core._errors import InvalidArgument

__all__ = ("KafkaOptions", "parse_location", "parse_options")

_KNOWN: Final = frozenset(
    {"topic_prefix", "connect_timeout", "request_timeout", "close_timeout", "max_batch_bytes"}
)


class KafkaOptions(NamedTuple):
    """The options of one ``open_wal(kafka_url, ...)`` call, with their defaults."""

    topic_prefix: str = "walsvc."
    connect_timeout: float = 10.0
    request_timeout: float = 30.0
    max_batch_bytes: int = 1024 * 1024
    close_timeout: float = 5.0


def parse_location(location: str) -> list[str]:
    """``host:port[,host:port...]`` -> bootstrap servers; ``InvalidArgument`` if malformed."""
    servers = location.split(",")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or "/" in server or not (port.isascii() and port.isdigit()):
            raise InvalidArgument(f"kafka:// URL needs host:port[,host:port...], got {location!r}")
        if not 0 < int(port) < 65536:
            raise InvalidArgument(f"kafka:// port out of range in {location!r}")
    return servers


def parse_options(options: Mapping[str, Any]) -> KafkaOptions:
    """Check the keyword options: unknown ones raise ``TypeError``, bad values
    ``InvalidArgument``."""
    unknown = set(options) - _KNOWN
    if unknown:
        raise TypeError(f"unknown option(s) for kafka:// WALs: {', '.join(sorted(unknown))}")
    result = KafkaOptions()._replace(**options)
    prefix = result.topic_prefix
    if (
        not isinstance(prefix, str)
        or len(prefix) > 40
        or not all(c.isascii() and (c.isalnum() or c in "._-") for c in prefix)
    ):
        raise InvalidArgument(
            f"topic_prefix must be at most 40 characters of [A-Za-z0-9._-], not {prefix!r}"
        )
    for name in ("connect_timeout", "request_timeout", "close_timeout"):
        value = getattr(result, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
            raise InvalidArgument(f"{name} must be in (0, 3600] seconds, not {value!r}")
    size = result.max_batch_bytes
    if type(size) is not int or not 1024 <= size <= 256 * 1024 * 1024:
        raise InvalidArgument(f"max_batch_bytes must be an int in [1 KiB, 256 MiB], not {size!r}")
    return result._replace(
        connect_timeout=float(result.connect_timeout),
        request_timeout=float(result.request_timeout),
        close_timeout=float(result.close_timeout),
    )
