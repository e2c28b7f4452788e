"""The options of the ``walsvc`` Spark data source, parsed once on the driver into a
picklable ``SourceOptions`` that every task receives.

Spark hands options over as a case-insensitive map of strings. It is read with ``get``
(never ``dict(options)``, which lower-cases the keys), and every key must be known:
a misspelt option is an error naming it, not a silently ignored setting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from walsvc.core._errors import InvalidArgument
from walsvc.core._filter import Filter
from walsvc.core._message import MessageType

__all__ = ("SourceOptions", "WriteOptions", "parse_source_options", "parse_write_options")

#: Records one batch-read partition covers at most (pchannels with sequence ids only).
DEFAULT_RECORDS_PER_PARTITION: Final = 1_000_000
#: Rows per Arrow record batch a read task yields, at most.
DEFAULT_ROWS_PER_BATCH: Final = 8192
#: Seconds a read may go without reaching the end of its range before it fails.
DEFAULT_STALL_TIMEOUT: Final = 120.0
#: Keys a writing task's dedup window holds (``interceptors.DEFAULT_MAX_KEYS``).
DEFAULT_DEDUP_MAX_KEYS: Final = 100_000
#: Seconds of log a writing task's dedup window covers (``interceptors.DEFAULT_MAX_AGE``).
DEFAULT_DEDUP_MAX_AGE: Final = 600.0
#: Prefix of options passed to ``open_wal`` as backend options (``backend.topic_prefix``).
BACKEND_PREFIX: Final = "backend."

_SOURCE_KEYS: Final = {
    "url",
    "pchannels",
    "vchannels",
    "types",
    "timetickfrom",
    "timetickto",
    "startafter",
    "maxrecordsperpartition",
    "minpartitions",
    "maxrecordspertrigger",
    "rowsperbatch",
    "stalltimeout",
    "txnbufferbytes",
    # Spark's own options for file-less sources; harmless to see here.
    "path",
}
_WRITE_KEYS: Final = {
    "url",
    "pchannel",
    "writeid",
    "appendbatch",
    "dedupmaxkeys",
    "dedupmaxage",
    "path",
    # Spark passes a streaming query's checkpointLocation option on to the sink.
    "checkpointlocation",
}


class SourceOptions(msgspec.Struct, frozen=True):
    """What to read: ``url`` and ``pchannels``, the walsvc filter (``vchannels``,
    ``types``, ``timetick_from``; broadcast and system messages pass them as they pass
    ``WAL.read`` filters), an inclusive ``timetick_to``, per-pchannel exclusive start ids
    (marshalled) and the tuning knobs."""

    url: str
    pchannels: tuple[str, ...]
    vchannels: tuple[str, ...] | None = None
    types: tuple[int, ...] | None = None
    timetick_from: int = 0
    timetick_to: int | None = None
    start_after: dict[str, str] = {}
    records_per_partition: int = DEFAULT_RECORDS_PER_PARTITION
    min_partitions: int = 1
    max_records_per_trigger: int | None = None
    rows_per_batch: int = DEFAULT_ROWS_PER_BATCH
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    txn_buffer_bytes: int = 64 << 20
    backend_options: dict[str, Any] = {}

    def source_filter(self) -> Filter:
        """The walsvc filter applied to stored messages (before transactions are
        assembled, as ``WAL.read`` applies it)."""
        return Filter(vchannels=self.vchannels, types=self.types)


class WriteOptions(msgspec.Struct, frozen=True):
    """Where rows go: ``url`` and ``pchannel``; ``write_id`` names the write so that a
    retried task's rows get the idempotency keys of its first attempt; ``append_batch``
    rows per append call; ``dedup_max_keys`` and ``dedup_max_age`` (seconds) size each
    task's dedup window, which must hold the keys a retried task re-appends."""

    url: str
    pchannel: str
    write_id: str | None = None
    append_batch: int = 1000
    dedup_max_keys: int = DEFAULT_DEDUP_MAX_KEYS
    dedup_max_age: float = DEFAULT_DEDUP_MAX_AGE
    backend_options: dict[str, Any] = {}


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the data source options of a read (batch or streaming)."""
    backend = _backend_options(options, _SOURCE_KEYS)
    url = _required(options, "url")
    if url.partition("://")[0] == "memory":
        raise InvalidArgument(
            "option 'url': a memory:// WAL lives in one process, and Spark reads in"
            " other processes (each would see an empty log of its own); use file://,"
            " kafka:// or pulsar://"
        )
    pchannels = _names(options, "pchannels")
    if not pchannels:
        raise InvalidArgument("option 'pchannels' is required: comma-separated pchannel names")
    start_after = _start_after(options.get("startAfter"), pchannels)
    timetick_to = _int(options, "timetickTo", None, minimum=0)
    return SourceOptions(
        url=url,
        pchannels=pchannels,
        vchannels=_names(options, "vchannels"),
        types=_types(options.get("types")),
        timetick_from=_int(options, "timetickFrom", 0, minimum=0) or 0,
        timetick_to=timetick_to,
        start_after=start_after,
        records_per_partition=_int(
            options, "maxRecordsPerPartition", DEFAULT_RECORDS_PER_PARTITION, minimum=1
        )
        or DEFAULT_RECORDS_PER_PARTITION,
        min_partitions=_int(options, "minPartitions", 1, minimum=1) or 1,
        max_records_per_trigger=_int(options, "maxRecordsPerTrigger", None, minimum=1),
        rows_per_batch=_int(options, "rowsPerBatch", DEFAULT_ROWS_PER_BATCH, minimum=1)
        or DEFAULT_ROWS_PER_BATCH,
        stall_timeout=_float(options, "stallTimeout", DEFAULT_STALL_TIMEOUT),
        txn_buffer_bytes=_int(options, "txnBufferBytes", 64 << 20, minimum=1) or 64 << 20,
        backend_options=backend,
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Validate the data source options of a write (batch or streaming)."""
    backend = _backend_options(options, _WRITE_KEYS)
    pchannel = _required(options, "pchannel")
    return WriteOptions(
        url=_required(options, "url"),
        pchannel=pchannel,
        write_id=options.get("writeId") or None,
        append_batch=_int(options, "appendBatch", 1000, minimum=1) or 1000,
        dedup_max_keys=_int(options, "dedupMaxKeys", DEFAULT_DEDUP_MAX_KEYS, minimum=1)
        or DEFAULT_DEDUP_MAX_KEYS,
        dedup_max_age=_float(options, "dedupMaxAge", DEFAULT_DEDUP_MAX_AGE),
        backend_options=backend,
    )


def _backend_options(options: Mapping[str, str], known: set[str]) -> dict[str, Any]:
    """The ``backend.*`` options as ``open_wal`` keywords; an unknown key is an error."""
    backend: dict[str, Any] = {}
    for key in options:
        folded = key.lower()
        if folded.startswith(BACKEND_PREFIX):
            name = key[len(BACKEND_PREFIX) :]
            backend[name.lower()] = _literal(options[key])
        elif folded not in known:
            raise InvalidArgument(
                f"unknown walsvc data source option {key!r}; known:"
                f" {', '.join(sorted(known - {'path'}))}, and backend.<name> for"
                " backend options"
            )
    return backend


def _literal(text: str) -> Any:
    """A backend option's value: a JSON number, boolean or null if it reads as one,
    else the string itself (``backend.connect_timeout=5`` is the number 5)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, int | float | bool) or value is None else text


def _required(options: Mapping[str, str], key: str) -> str:
    value = options.get(key)
    if not value:
        raise InvalidArgument(f"option {key!r} is required")
    return str(value)


def _names(options: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    """A comma-separated list (blanks around names ignored); None if the option is
    absent."""
    value = options.get(key)
    if value is None:
        return None
    names = tuple(dict.fromkeys(part.strip() for part in str(value).split(",")))
    if any(not name for name in names) and key == "pchannels":
        raise InvalidArgument(f"option {key!r} has an empty pchannel name: {value!r}")
    return names


def _types(value: str | None) -> tuple[int, ...] | None:
    """Message types by name (``INSERT``) or number (``2``), comma-separated."""
    if value is None:
        return None
    types: list[int] = []
    for part in str(value).split(","):
        name = part.strip()
        if name.lstrip("-").isdigit():
            types.append(int(name))
            continue
        try:
            types.append(int(MessageType[name.upper()]))
        except KeyError:
            raise InvalidArgument(
                f"option 'types': {name!r} is neither a number nor a walsvc.MessageType name"
            ) from None
    return tuple(types)


def _int(options: Mapping[str, str], key: str, default: int | None, *, minimum: int) -> int | None:
    value = options.get(key)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InvalidArgument(f"option {key!r} must be an integer, not {value!r}") from None
    if number < minimum:
        raise InvalidArgument(f"option {key!r} must be at least {minimum}, not {number}")
    return number


def _float(options: Mapping[str, str], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    try:
        number = float(str(value).strip())
    except ValueError:
        raise InvalidArgument(
            f"option {key!r} must be a number of seconds, not {value!r}"
        ) from None
    if not number > 0:
        raise InvalidArgument(f"option {key!r} must be > 0 seconds, not {number}")
    return number


def _start_after(value: str | None, pchannels: tuple[str, ...]) -> dict[str, str]:
    """``startAfter``: a JSON object of pchannel -> marshalled message id (exclusive)."""
    if value is None:
        return {}
    try:
        start = json.loads(value)
    except ValueError as exc:
        raise InvalidArgument(f"option 'startAfter' is not JSON: {exc}") from None
    if not isinstance(start, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in start.items()
    ):
        raise InvalidArgument(
            "option 'startAfter' must be a JSON object of pchannel -> marshalled message id"
        )
    unknown = set(start) - set(pchannels)
    if unknown:
        raise InvalidArgument(f"option 'startAfter' names pchannels not read: {sorted(unknown)}")
    return start
