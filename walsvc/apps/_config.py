"""Configuration: which backend a WAL uses and its options, from a TOML file and the
environment, decoded into msgspec Structs.

The file (read with ``tomllib``) has one ``[wal]`` table and one sub-table per backend::

    [wal]
    backend = "auto"            # "auto" (default) | "memory" | "file" | "kafka" | "pulsar"
    max_message_size = 1048576  # the WAL-level options of walsvc.open_wal
    tail_cache_bytes = 67108864
    tail_cache_age = 30.0

    [wal.file]
    path = "walsvc-data"        # relative to the config file's directory
    sync = "always"             # or "none"
    segment_size = 67108864
    poll_interval = 0.05

    [wal.kafka]
    bootstrap_servers = ["h1:9092", "h2:9092"]
    topic_prefix = "walsvc."
    connect_timeout = 10.0
    request_timeout = 30.0
    close_timeout = 5.0
    max_batch_bytes = 1048576

    [wal.pulsar]
    service_url = "pulsar://h1:6650"
    topic_prefix = "persistent://public/default/walsvc."
    connect_timeout = 10.0
    operation_timeout = 30.0
    close_timeout = 5.0
    batching_max_messages = 1000
    batching_max_publish_delay_ms = 1

    [wal.memory]
    name = "tests"

    [node]
    pchannels = ["p0", "p1"]    # what open_node_from_config opens by default

Environment: the key ``wal.kafka.bootstrap_servers`` is the variable
``WALSVC_WAL__KAFKA__BOOTSTRAP_SERVERS``: the prefix ``WALSVC_``, then the key's parts in
upper case joined by a double underscore. Values are text: numbers as decimal literals
(``1048576``, ``0.5``, ``1e-3``), strings as is (no quotes), lists comma-separated with
blanks around items ignored (``h1:9092, h2:9092``). A variable overrides the file's value
of its key only (key by key); setting a key of a section the file lacks adds that
section. Every variable starting with ``WALSVC_WAL`` or ``WALSVC_NODE`` must name a known
key, else ``InvalidArgument``. ``WALSVC_CONFIG`` names the file when ``load_config`` gets no path.

Choosing the backend (after the Milvus message-queue rule: several configured, a fixed
priority picks one): ``backend = "auto"`` takes the present section highest in
``BACKEND_PRIORITY`` (pulsar > kafka > file > memory); a section counts as present when
the file has its table or a variable sets one of its keys, complete or not, so a
half-written Pulsar section is an error rather than a silent fall back to Kafka. An
explicit ``backend`` needs its section; the others are then ignored. The chosen section
must hold its location key (``name``, ``path``, ``bootstrap_servers``, ``service_url``);
every other key is optional and, when absent, is not passed to ``open_wal``, so the
backend's own default applies. ``WalConfig.reason`` and ``WalConfig.describe()`` say what
was chosen and why, naming the source (file or variables) of the chosen section and of
the ones passed over: a stray ``WALSVC_WAL__PULSAR__SERVICE_URL`` that makes "auto" pick
Pulsar over the file's ``[wal.file]`` is named there. ``open_wal_from_config`` and
``open_node_from_config`` log that reason (logger ``walsvc``, INFO, one line per open)
and add it to the message of an open that fails.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal, NoReturn

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from walsvc.core._errors import InvalidArgument, WALError
from walsvc.node._node import Node, open_node
from walsvc.wal._api import WAL
from walsvc.wal._open import open_wal

__all__ = (
    "BACKEND_PRIORITY",
    "CONFIG_FILE_VARIABLE",
    "ENV_PREFIX",
    "ENV_SEPARATOR",
    "BackendName",
    "FileSection",
    "KafkaSection",
    "MemorySection",
    "NodeSection",
    "PulsarSection",
    "WalConfig",
    "WalSection",
    "load_config",
    "open_node_from_config",
    "open_wal_from_config",
)

BackendName = Literal["memory", "file", "kafka", "pulsar"]
"""A concrete backend: the URL scheme of the WAL a configuration opens."""

BACKEND_PRIORITY: Final[tuple[BackendName, ...]] = ("pulsar", "kafka", "file", "memory")
"""With ``backend = "auto"``, the first of these whose section is present is chosen."""

ENV_PREFIX: Final = "WALSVC_"
"""Prefix of every configuration variable; the key path follows it."""

ENV_SEPARATOR: Final = "__"
"""Separates the parts of a key path in a variable name (``WALSVC_WAL__FILE__SYNC``)."""

CONFIG_FILE_VARIABLE: Final = "WALSVC_CONFIG"
"""Names the TOML file ``load_config(None)`` reads, if set and not empty."""

_Seconds = Annotated[float, Meta(gt=0, le=3600)]
_Text = Annotated[str, Meta(min_length=1)]
_HOST_PORT: Final = r"^(\[[0-9A-Fa-f:.]+\]|[^\s,:\[\]/]+):[0-9]{1,5}$"
_PULSAR_URL: Final = r"^pulsar://[^\s/]+$"
_HostPort = Annotated[str, Meta(pattern=_HOST_PORT)]
_PCHANNEL_NAME: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
#: The top-level tables, each with its variables' prefix.
_TABLES: Final = ("wal", "node")
_log: Final = logging.getLogger("walsvc")


class MemorySection(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[wal.memory]``: ``name`` (required) makes the URL ``memory://NAME``."""

    name: _Text | UnsetType = UNSET


class FileSection(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[wal.file]``: ``path`` (required; relative to the config file's directory, or to
    the working directory when set by a variable) and the ``file://`` options ``sync``
    ("always" | "none"), ``segment_size`` (bytes, >= 4096), ``poll_interval``
    (seconds, (0, 60])."""

    path: _Text | UnsetType = UNSET
    sync: Literal["always", "none"] | UnsetType = UNSET
    segment_size: Annotated[int, Meta(ge=4096)] | UnsetType = UNSET
    poll_interval: Annotated[float, Meta(gt=0, le=60)] | UnsetType = UNSET


class KafkaSection(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[wal.kafka]``: ``bootstrap_servers`` (required, non-empty list of ``host:port``)
    and the ``kafka://`` options ``topic_prefix``, ``connect_timeout``,
    ``request_timeout`` and ``close_timeout`` (seconds, (0, 3600]), ``max_batch_bytes``
    (>= 1)."""

    bootstrap_servers: Annotated[list[_HostPort], Meta(min_length=1)] | UnsetType = UNSET
    topic_prefix: _Text | UnsetType = UNSET
    connect_timeout: _Seconds | UnsetType = UNSET
    request_timeout: _Seconds | UnsetType = UNSET
    close_timeout: _Seconds | UnsetType = UNSET
    max_batch_bytes: Annotated[int, Meta(ge=1)] | UnsetType = UNSET


class PulsarSection(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[wal.pulsar]``: ``service_url`` (required, ``pulsar://host:port[,host:port]``, used
    as the WAL URL) and the ``pulsar://`` options ``topic_prefix``, ``connect_timeout``,
    ``operation_timeout`` and ``close_timeout`` (seconds, (0, 3600]),
    ``batching_max_messages`` (>= 1),
    ``batching_max_publish_delay_ms`` (>= 0)."""

    service_url: Annotated[str, Meta(pattern=_PULSAR_URL)] | UnsetType = UNSET
    topic_prefix: _Text | UnsetType = UNSET
    connect_timeout: _Seconds | UnsetType = UNSET
    operation_timeout: _Seconds | UnsetType = UNSET
    close_timeout: _Seconds | UnsetType = UNSET
    batching_max_messages: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    batching_max_publish_delay_ms: Annotated[int, Meta(ge=0)] | UnsetType = UNSET


class WalSection(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[wal]``: the backend choice, the WAL-level options of ``open_wal``
    (``max_message_size`` >= 64, ``tail_cache_bytes`` >= 0, ``tail_cache_age`` seconds in
    (0, 86400]) and one optional section per backend (UNSET when absent)."""

    backend: Literal["auto", "memory", "file", "kafka", "pulsar"] = "auto"
    max_message_size: Annotated[int, Meta(ge=64)] | UnsetType = UNSET
    tail_cache_bytes: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    tail_cache_age: Annotated[float, Meta(gt=0, le=86_400)] | UnsetType = UNSET
    memory: MemorySection | UnsetType = UNSET
    file: FileSection | UnsetType = UNSET
    kafka: KafkaSection | UnsetType = UNSET
    pulsar: PulsarSection | UnsetType = UNSET


class NodeSection(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[node]``: ``pchannels``, the pchannels ``open_node_from_config`` opens unless
    given others (a non-empty list of names of 1-200 characters of ``[A-Za-z0-9._-]``,
    starting with a letter or digit; variable ``WALSVC_NODE__PCHANNELS=p0,p1``)."""

    pchannels: (
        Annotated[list[Annotated[str, Meta(pattern=_PCHANNEL_NAME)]], Meta(min_length=1)]
        | UnsetType
    ) = UNSET


class _Document(Struct, forbid_unknown_fields=True, frozen=True):
    """The whole file: the ``[wal]`` table and the optional ``[node]`` table."""

    wal: WalSection = msgspec.field(default_factory=WalSection)
    node: NodeSection = msgspec.field(default_factory=NodeSection)


# The key of each section that becomes (part of) the URL rather than an open_wal option.
_LOCATION_KEY: Final[dict[BackendName, str]] = {
    "memory": "name",
    "file": "path",
    "kafka": "bootstrap_servers",
    "pulsar": "service_url",
}
_WAL_OPTIONS: Final = ("max_message_size", "tail_cache_bytes", "tail_cache_age")


class WalConfig(Struct, frozen=True, kw_only=True):
    """A loaded configuration: the chosen ``backend``, why (``reason``: which setting chose
    it and where each section considered came from), the decoded ``wal`` section (file
    and environment merged, paths made absolute), the ``node`` section and the file it
    came from (``source``, None for the environment alone).

    Only ``load_config`` builds valid ones: the chosen section exists and has its
    location key, so ``url`` and ``open_options()`` never fail.
    """

    backend: BackendName
    requested: Literal["auto", "memory", "file", "kafka", "pulsar"]
    reason: str
    wal: WalSection
    source: str | None = None
    node: NodeSection = msgspec.field(default_factory=NodeSection)

    @property
    def pchannels(self) -> tuple[str, ...] | None:
        """``[node] pchannels``, or None when not configured."""
        names = self.node.pchannels
        return None if isinstance(names, UnsetType) else tuple(names)

    @property
    def url(self) -> str:
        """The URL ``walsvc.open_wal`` takes: ``memory://NAME``, ``file:///abs/path``,
        ``kafka://h1:p1,h2:p2`` or the Pulsar ``service_url``."""
        location = _location(self.wal, self.backend)
        if self.backend == "kafka":
            return "kafka://" + ",".join(location)
        if self.backend == "pulsar":
            return str(location)
        return f"{self.backend}://{location}"

    def open_options(self) -> dict[str, Any]:
        """The keyword options for ``walsvc.open_wal(self.url, pchannel, **options)``:
        exactly the WAL-level keys and the chosen backend's keys (other than its location)
        that the configuration sets; absent ones are left to open_wal's defaults."""
        options: dict[str, Any] = {}
        for key in _WAL_OPTIONS:
            value = getattr(self.wal, key)
            if value is not UNSET:
                options[key] = value
        section = getattr(self.wal, self.backend)
        for key in section.__struct_fields__:
            value = getattr(section, key)
            if key != _LOCATION_KEY[self.backend] and value is not UNSET:
                options[key] = list(value) if isinstance(value, list) else value
        return options

    def describe(self) -> str:
        """Several lines for logs and humans: backend, reason, URL, options, pchannels
        (when configured), source."""
        source = self.source if self.source is not None else "(environment only)"
        pchannels = "" if self.pchannels is None else f"pchannels: {list(self.pchannels)}\n"
        return (
            f"backend: {self.backend}\nreason: {self.reason}\nurl: {self.url}\n"
            f"options: {self.open_options()!r}\n{pchannels}source: {source}"
        )

    def summary(self) -> str:
        """One line: the URL, why this backend, and the file (the line the opens log)."""
        source = self.source if self.source is not None else "the environment alone"
        return f"{self.url} ({self.reason}; configuration from {source})"


async def open_wal_from_config(config: WalConfig, pchannel: str, *, read_only: bool = False) -> WAL:
    """Open ``pchannel`` as ``config`` says: ``open_wal(config.url, pchannel,
    read_only=read_only, **config.open_options())``, with open_wal's errors, whose
    message then ends with ``config.summary()``. Logs that summary first (logger
    ``walsvc``, INFO)."""
    _log.info("walsvc: opening pchannel %r at %s", pchannel, config.summary())
    try:
        return await open_wal(config.url, pchannel, read_only=read_only, **config.open_options())
    except WALError as exc:
        _reraise_with_summary(exc, config)


async def open_node_from_config(
    config: WalConfig,
    pchannels: Iterable[str] | None = None,
    *,
    read_only: bool = False,
    migrate: bool = False,
    pins: Mapping[str, str] | None = None,
) -> Node:
    """``walsvc.open_node(config.url, pchannels, ...)`` with ``config.open_options()``:
    ``pchannels`` default to the configuration's ``[node] pchannels``
    (``InvalidArgument`` if neither is given); ``read_only``, ``migrate`` and ``pins``
    mean what they mean to ``open_node``. Logs and reports errors as
    ``open_wal_from_config`` does."""
    names = config.pchannels if pchannels is None else pchannels
    if names is None:
        raise InvalidArgument(
            "no pchannels for the node: pass pchannels= or set [node] pchannels in the"
            f" configuration (or {ENV_PREFIX}NODE{ENV_SEPARATOR}PCHANNELS=p0,p1)"
        )
    names = list(names) if not isinstance(names, (str, bytes)) else names
    _log.info("walsvc: opening node %s at %s", names, config.summary())
    try:
        return await open_node(
            config.url,
            names,
            read_only=read_only,
            migrate=migrate,
            pins=pins,
            **config.open_options(),
        )
    except WALError as exc:
        _reraise_with_summary(exc, config)


def _reraise_with_summary(exc: WALError, config: WalConfig) -> NoReturn:
    """Raise ``exc`` again, its type kept, its message ending with where the backend
    came from (chained to the original)."""
    try:
        again = type(exc)(f"{exc}; backend from the configuration: {config.summary()}")
    except TypeError:  # a subclass with a constructor of its own: keep it, add a note
        exc.add_note(f"backend from the configuration: {config.summary()}")
        raise exc from exc.__cause__
    raise again from exc


def load_config(
    path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> WalConfig:
    """Read the TOML file at ``path`` (None: the file named by ``WALSVC_CONFIG``, or no
    file), override it key by key with the ``WALSVC_WAL__*`` variables of ``environ``
    (default ``os.environ``) and choose the backend (see the module docstring).

    Raises ``InvalidArgument`` naming the file or the variable and the key for an
    unreadable file, a TOML syntax error, an unknown key or variable, a value of the wrong
    type or out of range, no backend configured, or a chosen backend whose section is
    missing or lacks its location key.
    """
    env = os.environ if environ is None else environ
    if path is None:
        path = env.get(CONFIG_FILE_VARIABLE) or None
    source = os.path.abspath(os.fspath(path)) if path is not None else None
    document: dict[str, Any] = _read_file(source) if source is not None else {}
    in_file = set(document.get("wal", {}))  # the keys and sections the file itself has
    origins: dict[tuple[str, ...], str] = {}
    for variable, keys, value in _read_environment(env):
        table = document
        for key in keys[:-1]:
            table = table.setdefault(key, {})
        table[keys[-1]] = value
        origins[keys] = f"environment variable {variable}"
    where = f"config file {source}" if source else "environment"
    converted = _convert(document, where, strict=True)
    wal = converted.wal
    wal = _absolute_file_path(wal, source, from_env=("wal", "file", "path") in origins)
    _check_ports(wal, origins.get(("wal", "kafka", "bootstrap_servers"), where))
    default = "the default" if "backend" not in in_file else where
    backend_origin = origins.get(("wal", "backend"), default)
    sections = _section_origins(in_file, source, origins)
    backend, reason = _choose(wal, backend_origin, sections)
    return WalConfig(
        backend=backend,
        requested=wal.backend,
        reason=reason,
        wal=wal,
        source=source,
        node=converted.node,
    )


def _section_origins(
    in_file: Iterable[str], source: str | None, origins: Mapping[tuple[str, ...], str]
) -> dict[str, str]:
    """For each backend section present, where it comes from: the file (it has the
    table), the variables that set its keys, or both."""
    files = {name: f"config file {source}" for name in in_file if name in _LOCATION_KEY}
    variables: dict[str, list[str]] = {}
    for keys, origin in sorted(origins.items()):
        if len(keys) == 3 and keys[0] == "wal" and keys[1] in _LOCATION_KEY:
            variables.setdefault(keys[1], []).append(origin.rpartition(" ")[2])
    found: dict[str, str] = {}
    for name in _LOCATION_KEY:
        where = [files[name]] if name in files else []
        if name in variables:
            plural = "s" if len(variables[name]) > 1 else ""
            where.append(f"environment variable{plural} {', '.join(variables[name])}")
        if where:
            found[name] = " and ".join(where)
    return found


def _read_file(path: str) -> dict[str, Any]:
    """The file's TOML table, checked against the schema on its own (so an error names the
    file, not a variable)."""
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except OSError as exc:
        raise InvalidArgument(f"config file {path}: cannot read it: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path}: not valid TOML: {exc}") from exc
    _convert(raw, f"config file {path}", strict=True)
    return raw


def _read_environment(env: Mapping[str, str]) -> list[tuple[str, tuple[str, ...], Any]]:
    """(variable, key path, decoded value) for every ``WALSVC_WAL*`` variable, each
    checked on its own; sorted by name so errors are deterministic."""
    found: list[tuple[str, tuple[str, ...], Any]] = []
    for variable in sorted(env):
        if not variable.startswith(tuple(ENV_PREFIX + t.upper() for t in _TABLES)):
            continue
        text = env[variable]
        keys, info = _key_of(variable)
        value: Any = text
        if isinstance(info, msgspec.inspect.ListType):
            value = [item.strip() for item in text.split(",")]
        for key in reversed(keys):
            value = {key: value}
        decoded: Any = _convert(value, f"environment variable {variable}={text!r}", strict=False)
        for key in keys:
            decoded = getattr(decoded, key)
        found.append((variable, keys, decoded))
    return found


def _key_of(variable: str) -> tuple[tuple[str, ...], msgspec.inspect.Type]:
    """The key path a variable names and the key's type; ``InvalidArgument`` unless it
    names a key (not a section) of the schema."""
    keys: list[str] = []
    info: msgspec.inspect.Type = msgspec.inspect.type_info(_Document)
    for part in variable[len(ENV_PREFIX) :].split(ENV_SEPARATOR):
        if not isinstance(info, msgspec.inspect.StructType):
            raise InvalidArgument(
                f"environment variable {variable}: {'.'.join(keys)!r} is a key, not a section"
            )
        field = next((f for f in info.fields if f.name.upper() == part), None)
        if field is None:
            known = ", ".join(_variable(keys, f.name) for f in info.fields)
            if not keys:
                known = " or ".join(f"{ENV_PREFIX}{t.upper()}{ENV_SEPARATOR}<KEY>" for t in _TABLES)
                known += ", with a double underscore"
            raise InvalidArgument(
                f"environment variable {variable}: unknown key"
                f" {'.'.join([*keys, part.lower()])!r} (known here: {known})"
            )
        keys.append(field.name)
        info = field.type
    if isinstance(info, msgspec.inspect.StructType):
        raise InvalidArgument(
            f"environment variable {variable}: {'.'.join(keys)!r} is a section, not a key;"
            f" set its keys, e.g. {_variable(keys, info.fields[0].name)}"
        )
    return tuple(keys), info


def _variable(keys: list[str], name: str) -> str:
    return ENV_PREFIX + ENV_SEPARATOR.join(k.upper() for k in [*keys, name])


_AT: Final = re.compile(r"^(?P<why>.*) - at `\$(?P<path>[^`]*)`$")
_UNKNOWN: Final = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")


def _convert(raw: Any, where: str, *, strict: bool) -> _Document:
    """``raw`` decoded into the schema; a failure is an ``InvalidArgument`` saying where
    (file or variable), which key and why."""
    try:
        return msgspec.convert(raw, _Document, strict=strict)
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = _AT.match(message)
        why, key = (match["why"], match["path"].lstrip(".")) if match else (message, "")
        unknown = _UNKNOWN.match(why)
        if unknown is not None:
            key = f"{key}.{unknown['name']}" if key else unknown["name"]
            raise InvalidArgument(f"{where}: unknown key {key!r}") from None
        for pattern, expected in ((_HOST_PORT, "host:port"), (_PULSAR_URL, "pulsar://host:port")):
            if why.endswith(f"matching regex {pattern!r}"):
                why = f"expected {expected}"
        allowed = _allowed_values(key) if key else ""
        if allowed:
            why += f" (allowed: {allowed})"
        raise InvalidArgument(f"{where}: {key}: {why}" if key else f"{where}: {why}") from None


def _allowed_values(key: str) -> str:
    """The literal choices of ``key`` (a dotted path), or "" if it has none."""
    info: msgspec.inspect.Type = msgspec.inspect.type_info(_Document)
    for part in key.split("."):
        if not isinstance(info, msgspec.inspect.StructType):
            return ""
        field = next((f for f in info.fields if f.name == part), None)
        if field is None:
            return ""
        info = field.type
    if isinstance(info, msgspec.inspect.LiteralType):
        return ", ".join(repr(v) for v in info.values)
    return ""


def _absolute_file_path(wal: WalSection, source: str | None, *, from_env: bool) -> WalSection:
    """``wal.file.path`` made absolute: a file's relative path is taken from the file's
    directory, a variable's from the working directory; ``~`` is expanded."""
    if isinstance(wal.file, UnsetType) or isinstance(wal.file.path, UnsetType):
        return wal
    path = os.path.expanduser(wal.file.path)
    if source is not None and not from_env:
        path = os.path.join(os.path.dirname(source), path)
    file = msgspec.structs.replace(wal.file, path=os.path.abspath(path))
    return msgspec.structs.replace(wal, file=file)


def _check_ports(wal: WalSection, where: str) -> None:
    """Every Kafka bootstrap server's port is in 1-65535."""
    if isinstance(wal.kafka, UnsetType) or isinstance(wal.kafka.bootstrap_servers, UnsetType):
        return
    for server in wal.kafka.bootstrap_servers:
        if not 0 < int(server.rpartition(":")[2]) < 65536:
            raise InvalidArgument(
                f"{where}: wal.kafka.bootstrap_servers: {server!r} has a port outside 1-65535"
            )


def _choose(
    wal: WalSection, backend_origin: str, sections: Mapping[str, str]
) -> tuple[BackendName, str]:
    """The backend to open and the reason, or ``InvalidArgument`` if there is none.
    ``sections`` says where each present section comes from."""
    present = [name for name in BACKEND_PRIORITY if not isinstance(getattr(wal, name), UnsetType)]
    priority = " > ".join(BACKEND_PRIORITY)

    def named(name: str) -> str:
        origin = sections.get(name)
        return f"[wal.{name}] (from {origin})" if origin else f"[wal.{name}]"

    if wal.backend == "auto":
        if not present:
            raise InvalidArgument(
                "no WAL backend configured: set wal.backend and its section, or add one of the"
                f" sections {', '.join(f'[wal.{n}]' for n in BACKEND_PRIORITY)}"
            )
        backend = present[0]
        reason = (
            f"backend 'auto' ({backend_origin}): {named(backend)} is the present section"
            f" highest in the priority {priority}"
        )
        if len(present) > 1:
            reason += f"; ignored: {', '.join(named(n) for n in present[1:])}"
    else:
        backend = wal.backend
        reason = f"backend {backend!r} set by {backend_origin}"
        if backend in present:
            reason += f", {named(backend)}"
        if backend not in present:
            key = _LOCATION_KEY[backend]
            raise InvalidArgument(
                f"{reason}, but there is no [wal.{backend}] section: add it with at least"
                f" wal.{backend}.{key} (or {_variable(['wal', backend], key)})"
            )
    if isinstance(_location(wal, backend), UnsetType):
        key = _LOCATION_KEY[backend]
        raise InvalidArgument(
            f"{reason}, but [wal.{backend}] is incomplete: wal.{backend}.{key} is required"
            f" (or {_variable(['wal', backend], key)})"
        )
    return backend, reason


def _location(wal: WalSection, backend: BackendName) -> Any:
    """The chosen section's location value (UNSET if absent)."""
    return getattr(getattr(wal, backend), _LOCATION_KEY[backend])
