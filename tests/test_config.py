"""walsvc.load_config: the TOML file, the WALSVC_WAL__* variables, their merge, the backend
choice, the errors, and a round trip from a config to an open WAL."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import uuid
from pathlib import Path

import pytest
from msgspec import UNSET

import walsvc
from walsvc import DeliverPolicy, InvalidArgument, Message, MessageType, WalConfig

FULL = """
[wal]
max_message_size = 2048
tail_cache_bytes = 0
tail_cache_age = 5

[wal.memory]
name = "m1"

[wal.file]
path = "data"
sync = "none"
segment_size = 8192
poll_interval = 0.5

[wal.kafka]
bootstrap_servers = ["k1:9092", "k2:9093"]
topic_prefix = "t."
connect_timeout = 3
request_timeout = 4.5
close_timeout = 1.5
max_batch_bytes = 65536

[wal.pulsar]
service_url = "pulsar://p1:6650"
topic_prefix = "persistent://public/default/x."
connect_timeout = 2.0
operation_timeout = 7.0
close_timeout = 2.5
batching_max_messages = 100
batching_max_publish_delay_ms = 3
"""


def _write(tmp_path: Path, text: str, name: str = "walsvc.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _load(tmp_path: Path, text: str, **environ: str) -> WalConfig:
    return walsvc.load_config(_write(tmp_path, text), environ=environ)


# ---------------------------------------------------------------------------------------
# File only, environment only, both


def test_file_only_every_backend_section_gives_its_url_and_exact_options(
    tmp_path: Path,
) -> None:
    wal_options = {"max_message_size": 2048, "tail_cache_bytes": 0, "tail_cache_age": 5.0}
    expected = {
        "memory": ("memory://m1", {}),
        "file": (
            f"file://{tmp_path / 'data'}",
            {"sync": "none", "segment_size": 8192, "poll_interval": 0.5},
        ),
        "kafka": (
            "kafka://k1:9092,k2:9093",
            {
                "topic_prefix": "t.",
                "connect_timeout": 3.0,
                "request_timeout": 4.5,
                "close_timeout": 1.5,
                "max_batch_bytes": 65536,
            },
        ),
        "pulsar": (
            "pulsar://p1:6650",
            {
                "topic_prefix": "persistent://public/default/x.",
                "connect_timeout": 2.0,
                "operation_timeout": 7.0,
                "close_timeout": 2.5,
                "batching_max_messages": 100,
                "batching_max_publish_delay_ms": 3,
            },
        ),
    }
    for backend, (url, options) in expected.items():
        text = FULL.replace("[wal]\n", f'[wal]\nbackend = "{backend}"\n', 1)
        config = _load(tmp_path, text)
        assert (config.backend, config.requested) == (backend, backend)
        assert config.url == url
        assert config.open_options() == {**wal_options, **options}
        assert config.source == str(tmp_path / "walsvc.toml")
        assert f"set by config file {config.source}" in config.reason
    # Timeouts given as TOML integers are floats after decoding.
    assert isinstance(_load(tmp_path, FULL).open_options()["connect_timeout"], float)


def test_absent_keys_are_not_passed_so_backend_defaults_apply(tmp_path: Path) -> None:
    config = _load(tmp_path, '[wal.kafka]\nbootstrap_servers = ["k:1"]\n')
    assert config.url == "kafka://k:1"
    assert config.open_options() == {}


def test_relative_file_path_is_taken_from_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etc").mkdir()
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path / "etc", '[wal.file]\npath = "../var/wal"\n')
    assert walsvc.load_config(path, environ={}).url == f"file://{tmp_path / 'var' / 'wal'}"
    # A variable's relative path is taken from the working directory.
    config = walsvc.load_config(path, environ={"WALSVC_WAL__FILE__PATH": "here"})
    assert config.url == f"file://{tmp_path / 'here'}"


def test_environment_only(tmp_path: Path) -> None:
    config = walsvc.load_config(
        environ={
            "WALSVC_WAL__BACKEND": "kafka",
            "WALSVC_WAL__KAFKA__BOOTSTRAP_SERVERS": "h1:9092, h2:9092",
            "WALSVC_WAL__KAFKA__CONNECT_TIMEOUT": "2.5",
            "WALSVC_WAL__KAFKA__MAX_BATCH_BYTES": "1048576",
            "WALSVC_WAL__KAFKA__TOPIC_PREFIX": "a b",
            "WALSVC_WAL__TAIL_CACHE_AGE": "1e1",
            "WALSVC_TEST_SEED": "7",  # other WALSVC_ variables are not configuration
            "PATH": "/bin",
        }
    )
    assert config.source is None
    assert config.url == "kafka://h1:9092,h2:9092"
    assert config.open_options() == {
        "tail_cache_age": 10.0,
        "connect_timeout": 2.5,
        "max_batch_bytes": 1048576,
        "topic_prefix": "a b",
    }
    assert "environment variable WALSVC_WAL__BACKEND" in config.reason


def test_walsvc_config_names_the_file_when_no_path_is_given(tmp_path: Path) -> None:
    path = _write(tmp_path, '[wal.memory]\nname = "from-file"\n')
    config = walsvc.load_config(environ={"WALSVC_CONFIG": str(path)})
    assert (config.url, config.source) == ("memory://from-file", str(path))
    other = _write(tmp_path, '[wal.memory]\nname = "explicit"\n', "other.toml")
    assert walsvc.load_config(other, environ={"WALSVC_CONFIG": str(path)}).url == (
        "memory://explicit"
    )


def test_environment_overrides_the_file_key_by_key(tmp_path: Path) -> None:
    text = """
[wal]
backend = "kafka"
max_message_size = 4096

[wal.kafka]
bootstrap_servers = ["file:1"]
topic_prefix = "file."
connect_timeout = 1.0
"""
    config = _load(
        tmp_path,
        text,
        WALSVC_WAL__KAFKA__CONNECT_TIMEOUT="9",
        WALSVC_WAL__KAFKA__REQUEST_TIMEOUT="8",
        WALSVC_WAL__PULSAR__SERVICE_URL="pulsar://env:6650",  # adds a section
    )
    assert config.backend == "kafka"  # the file's explicit choice stands
    assert config.url == "kafka://file:1"
    assert config.open_options() == {
        "max_message_size": 4096,
        "topic_prefix": "file.",
        "connect_timeout": 9.0,
        "request_timeout": 8.0,
    }
    assert config.wal.pulsar is not UNSET
    # And the environment can override the choice itself.
    switched = _load(tmp_path, text, WALSVC_WAL__BACKEND="auto", **_pulsar_env())
    assert (switched.backend, switched.url) == ("pulsar", "pulsar://env:6650")
    assert switched.open_options() == {"max_message_size": 4096}


def _pulsar_env() -> dict[str, str]:
    return {"WALSVC_WAL__PULSAR__SERVICE_URL": "pulsar://env:6650"}


# ---------------------------------------------------------------------------------------
# Unknown keys, bad values


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[wal.kafka]\nbootstrap_server = ["k:1"]\n', "wal.kafka.bootstrap_server"),
        ("[wal]\nbackends = 'file'\n", "wal.backends"),
        ("[wal.rocksmq]\npath = 'x'\n", "wal.rocksmq"),
        ("[walsvc]\nbackend = 'file'\n", "walsvc"),
        ('[wal.file]\npath = "d"\n[wal.file.extra]\nx = 1\n', "wal.file.extra"),
    ],
)
def test_unknown_key_in_the_file_names_the_key_and_the_file(
    tmp_path: Path, text: str, key: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InvalidArgument) as caught:
        walsvc.load_config(path, environ={})
    assert str(caught.value) == f"config file {path}: unknown key {key!r}"


@pytest.mark.parametrize(
    ("variable", "says"),
    [
        ("WALSVC_WAL__KAFKA__BOOTSTRAP_SERVER", "unknown key 'wal.kafka.bootstrap_server'"),
        ("WALSVC_WAL__ROCKSMQ__PATH", "unknown key 'wal.rocksmq'"),
        ("WALSVC_WAL_BACKEND", "double underscore"),
        ("WALSVC_WAL", "is a section, not a key"),
        ("WALSVC_WAL__FILE", "'wal.file' is a section, not a key"),
        ("WALSVC_WAL__BACKEND__X", "'wal.backend' is a key, not a section"),
        ("WALSVC_WAL__file__PATH", "unknown key 'wal.file'"),
    ],
)
def test_unknown_variable_names_the_variable(variable: str, says: str) -> None:
    environ = {variable: "x", "WALSVC_WAL__MEMORY__NAME": "m"}
    with pytest.raises(InvalidArgument) as caught:
        walsvc.load_config(environ=environ)
    assert str(caught.value).startswith(f"environment variable {variable}: ")
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[wal]\nbackend = 'rocksmq'\n", "wal.backend: Invalid enum value 'rocksmq' (allowed: "),
        ("[wal]\nmax_message_size = 63\n", "wal.max_message_size: Expected `int` >= 64"),
        ("[wal]\nmax_message_size = '1000'\n", "wal.max_message_size: Expected `int`, got `str`"),
        ("[wal]\ntail_cache_bytes = true\n", "wal.tail_cache_bytes: Expected `int`, got `bool`"),
        ("[wal]\ntail_cache_age = 0\n", "wal.tail_cache_age: Expected `float` > 0"),
        ("[wal]\ntail_cache_age = nan\n", "wal.tail_cache_age: Expected `float` > 0"),
        ("[wal.file]\nsync = 'sometimes'\n", "wal.file.sync: Invalid enum value 'sometimes'"),
        ("[wal.file]\nsegment_size = 4095\n", "wal.file.segment_size: Expected `int` >= 4096"),
        ("[wal.file]\npath = ''\n", "wal.file.path: Expected `str` of length >= 1"),
        ("[wal.kafka]\nbootstrap_servers = 'k:1'\n", "bootstrap_servers: Expected `array`"),
        ("[wal.kafka]\nbootstrap_servers = []\n", "bootstrap_servers: Expected `array` of len"),
        (
            "[wal.kafka]\nbootstrap_servers = ['k:1', 'k2']\n",
            "wal.kafka.bootstrap_servers[1]: expected host:port",
        ),
        ("[wal.kafka]\nbootstrap_servers = ['k:70000']\n", "'k:70000' has a port outside"),
        ("[wal.kafka]\nconnect_timeout = inf\n", "wal.kafka.connect_timeout: Expected `float` <="),
        ("[wal.kafka]\nrequest_timeout = -1\n", "wal.kafka.request_timeout: Expected `float` > 0"),
        ("[wal.pulsar]\nservice_url = 'http://p:1'\n", "service_url: expected pulsar://host:port"),
        ("[wal.pulsar]\nbatching_max_messages = 0\n", "batching_max_messages: Expected `int` >="),
        ("[wal.pulsar]\nbatching_max_publish_delay_ms = 1.5\n", "Expected `int`, got `float`"),
    ],
)
def test_bad_value_in_the_file_names_the_file_the_key_and_why(
    tmp_path: Path, text: str, says: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InvalidArgument) as caught:
        walsvc.load_config(path, environ={})
    assert str(caught.value).startswith(f"config file {path}: ")
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("WALSVC_WAL__BACKEND", "Kafka", "wal.backend: Invalid enum value 'Kafka'"),
        ("WALSVC_WAL__MAX_MESSAGE_SIZE", "1.5", "Expected `int`, got `str`"),
        ("WALSVC_WAL__MAX_MESSAGE_SIZE", "", "Expected `int`, got `str`"),
        ("WALSVC_WAL__TAIL_CACHE_BYTES", "-1", "Expected `int` >= 0"),
        ("WALSVC_WAL__FILE__POLL_INTERVAL", "61", "Expected `float` <= 60"),
        ("WALSVC_WAL__KAFKA__BOOTSTRAP_SERVERS", "k:1,,k:2", "bootstrap_servers[1]: expected"),
        ("WALSVC_WAL__KAFKA__BOOTSTRAP_SERVERS", "k:0", "'k:0' has a port outside 1-65535"),
        ("WALSVC_WAL__PULSAR__CONNECT_TIMEOUT", "ten", "Expected `float`, got `str`"),
    ],
)
def test_bad_value_in_a_variable_names_the_variable_the_value_and_why(
    variable: str, value: str, says: str
) -> None:
    environ = {variable: value, "WALSVC_WAL__MEMORY__NAME": "m"}
    with pytest.raises(InvalidArgument) as caught:
        walsvc.load_config(environ=environ)
    assert str(caught.value).startswith(f"environment variable {variable}")
    assert says in str(caught.value)


def test_unreadable_or_malformed_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(InvalidArgument, match="cannot read it"):
        walsvc.load_config(missing, environ={})
    with pytest.raises(InvalidArgument, match="cannot read it"):
        walsvc.load_config(environ={"WALSVC_CONFIG": str(missing)})
    bad = _write(tmp_path, "[wal\nbackend = 'file'\n")
    with pytest.raises(InvalidArgument) as caught:
        walsvc.load_config(bad, environ={})
    assert str(caught.value).startswith(f"config file {bad}: not valid TOML")


# ---------------------------------------------------------------------------------------
# Choosing the backend


@pytest.mark.parametrize(
    ("sections", "chosen"),
    [
        (("memory", "file", "kafka", "pulsar"), "pulsar"),
        (("memory", "file", "kafka"), "kafka"),
        (("memory", "file"), "file"),
        (("memory",), "memory"),
        (("memory", "kafka"), "kafka"),
        (("file", "pulsar"), "pulsar"),
    ],
)
def test_auto_picks_the_present_section_highest_in_the_priority(
    tmp_path: Path, sections: tuple[str, ...], chosen: str
) -> None:
    located = {
        "memory": 'name = "m"',
        "file": 'path = "d"',
        "kafka": 'bootstrap_servers = ["k:1"]',
        "pulsar": 'service_url = "pulsar://p:1"',
    }
    text = "".join(f"[wal.{name}]\n{located[name]}\n" for name in sections)
    config = _load(tmp_path, text)
    assert walsvc.apps._config.BACKEND_PRIORITY == ("pulsar", "kafka", "file", "memory")
    assert (config.requested, config.backend) == ("auto", chosen)
    assert config.url.startswith(f"{chosen}://")
    from_file = f"(from config file {config.source})"
    assert (
        f"backend 'auto' (the default): [wal.{chosen}] {from_file} is the present section"
        " highest in the priority" in config.reason
    )
    for ignored in set(sections) - {chosen}:
        assert f"[wal.{ignored}] {from_file}" in config.reason
    assert f"backend: {chosen}\nreason: {config.reason}\nurl: {config.url}\n" in (config.describe())


def test_auto_with_nothing_configured_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match="no WAL backend configured"):
        walsvc.load_config(environ={})


def test_auto_does_not_fall_back_past_an_incomplete_higher_section(tmp_path: Path) -> None:
    text = '[wal.pulsar]\ntopic_prefix = "x"\n[wal.kafka]\nbootstrap_servers = ["k:1"]\n'
    with pytest.raises(InvalidArgument) as caught:
        _load(tmp_path, text)
    assert "[wal.pulsar] is incomplete: wal.pulsar.service_url is required" in str(caught.value)
    assert "WALSVC_WAL__PULSAR__SERVICE_URL" in str(caught.value)
    # Completing it from the environment works.
    assert _load(tmp_path, text, **_pulsar_env()).url == "pulsar://env:6650"


@pytest.mark.parametrize("backend", ["memory", "file", "kafka", "pulsar"])
def test_explicit_backend_without_its_section_is_an_error(tmp_path: Path, backend: str) -> None:
    other = "kafka" if backend == "memory" else "memory"
    text = f'[wal]\nbackend = "{backend}"\n[wal.{other}]\n'
    with pytest.raises(InvalidArgument) as caught:
        _load(tmp_path, text)
    assert f"there is no [wal.{backend}] section" in str(caught.value)
    assert f"WALSVC_WAL__{backend.upper()}__" in str(caught.value)


@pytest.mark.parametrize(
    ("backend", "key"),
    [
        ("memory", "name"),
        ("file", "path"),
        ("kafka", "bootstrap_servers"),
        ("pulsar", "service_url"),
    ],
)
def test_explicit_backend_with_an_incomplete_section_is_an_error(
    tmp_path: Path, backend: str, key: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        walsvc.load_config(
            environ={
                "WALSVC_WAL__BACKEND": backend,
                "WALSVC_CONFIG": str(_write(tmp_path, f"[wal.{backend}]\n")),
            }
        )
    assert f"[wal.{backend}] is incomplete: wal.{backend}.{key} is required" in str(caught.value)


# ---------------------------------------------------------------------------------------
# Round trips: a config opens a real WAL


async def _append_and_read_back(config: WalConfig, pchannel: str) -> None:
    async with await walsvc.open_wal_from_config(config, pchannel) as wal:
        result = await wal.append(Message(payload=b"configured", vchannel="v"))
    async with await walsvc.open_wal_from_config(config, pchannel, read_only=True) as reader:
        async with asyncio.timeout(10), reader.read(DeliverPolicy.all()) as scanner:
            async for message in scanner:
                if message.type == MessageType.INSERT:
                    break
    assert (message.payload, message.vchannel) == (b"configured", "v")
    assert message.message_id == result.message_id


async def test_round_trip_file_wal_from_a_config(tmp_path: Path) -> None:
    text = """
[wal]
backend = "file"
max_message_size = 4096
tail_cache_bytes = 1024

[wal.file]
path = "log"
sync = "none"
segment_size = 8192
poll_interval = 0.01

[wal.memory]
name = "unused"
"""
    config = _load(tmp_path, text)
    await _append_and_read_back(config, "p0")
    assert (tmp_path / "log" / "p0" / "head").is_file()
    # The WAL-level option reached open_wal: a message over 4096 bytes is refused.
    async with await walsvc.open_wal_from_config(config, "p0") as wal:
        with pytest.raises(walsvc.MessageTooLarge):
            await wal.append(Message(payload=b"x" * 5000, vchannel="v"))


async def test_round_trip_memory_wal_from_the_environment() -> None:
    name = f"config-{uuid.uuid4().hex}"
    config = walsvc.load_config(
        environ={"WALSVC_WAL__MEMORY__NAME": name, "WALSVC_WAL__TAIL_CACHE_AGE": "2"}
    )
    assert config.url == f"memory://{name}"
    await _append_and_read_back(config, "p0")


# ---------------------------------------------------------------------------------------
# Saying which source chose the backend; nodes from a configuration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_a_stray_variable_that_switches_auto_is_named(tmp_path: Path) -> None:
    """The file configures [wal.file]; a forgotten WALSVC_WAL__PULSAR__SERVICE_URL makes
    "auto" pick Pulsar. The reason names the variable and the file's section passed over."""
    path = _write(tmp_path, '[wal.file]\npath = "data"\n')
    config = walsvc.load_config(
        path, environ={"WALSVC_WAL__PULSAR__SERVICE_URL": "pulsar://stray:6650"}
    )
    assert config.backend == "pulsar"
    assert config.reason == (
        "backend 'auto' (the default): [wal.pulsar] (from environment variable"
        " WALSVC_WAL__PULSAR__SERVICE_URL) is the present section highest in the priority"
        f" pulsar > kafka > file > memory; ignored: [wal.file] (from config file {path})"
    )
    both = walsvc.load_config(path, environ={"WALSVC_WAL__FILE__SYNC": "none"})
    assert f"[wal.file] (from config file {path} and environment variable" in both.reason
    explicit = walsvc.load_config(
        path, environ={"WALSVC_WAL__BACKEND": "file", "WALSVC_WAL__MEMORY__NAME": "m"}
    )
    assert explicit.reason == (
        "backend 'file' set by environment variable WALSVC_WAL__BACKEND,"
        f" [wal.file] (from config file {path})"
    )


async def test_an_open_logs_the_choice_and_a_failed_one_names_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, '[wal.file]\npath = "data"\nsync = "none"\n')
    config = walsvc.load_config(path, environ={})
    with caplog.at_level(logging.INFO, logger="walsvc"):
        async with await walsvc.open_wal_from_config(config, "p0"):
            pass
    (record,) = [r for r in caplog.records if r.name == "walsvc"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == f"walsvc: opening pchannel 'p0' at {config.summary()}"
    assert config.summary() == (
        f"file://{tmp_path / 'data'} ({config.reason}; configuration from {path})"
    )
    # The stray variable again, now pointing at nothing: the error says where it came from.
    stray = walsvc.load_config(
        path,
        environ={
            "WALSVC_WAL__PULSAR__SERVICE_URL": f"pulsar://127.0.0.1:{_free_port()}",
            "WALSVC_WAL__PULSAR__CONNECT_TIMEOUT": "1",
        },
    )
    with pytest.raises(walsvc.BackendUnavailable) as caught:
        await walsvc.open_wal_from_config(stray, "p0")
    assert "WALSVC_WAL__PULSAR__SERVICE_URL" in str(caught.value)
    assert str(caught.value).endswith(f"; backend from the configuration: {stray.summary()}")
    assert isinstance(caught.value.__cause__, walsvc.BackendUnavailable)


async def test_a_node_from_the_configuration(tmp_path: Path) -> None:
    path = _write(tmp_path, '[wal.file]\npath = "data"\n[node]\npchannels = ["p0", "p1"]\n')
    config = walsvc.load_config(path, environ={})
    assert config.pchannels == ("p0", "p1")
    assert "pchannels: ['p0', 'p1']\n" in config.describe()
    async with await walsvc.open_node_from_config(config) as node:
        assert node.routing.pchannels == ("p0", "p1")
        await node.append(Message(payload=b"x", vchannel="v"))
    # The variable overrides the file; pins and migrate reach open_node.
    moved = walsvc.load_config(path, environ={"WALSVC_NODE__PCHANNELS": "p0, p1, p2"})
    assert moved.pchannels == ("p0", "p1", "p2")
    with pytest.raises(walsvc.RoutingMismatch) as caught:
        await walsvc.open_node_from_config(moved)
    assert f"configuration from {path}" in str(caught.value)
    async with await walsvc.open_node_from_config(moved, migrate=True, pins={"v": "p2"}) as node:
        assert (node.routing.version, node.pchannel_of("v")) == (2, "p2")
    async with await walsvc.open_node_from_config(moved, read_only=True) as reader:
        assert reader.routing.version == 2
    async with await walsvc.open_node_from_config(config, ["p0", "p1", "p2"]) as node:
        assert node.routing.version == 2  # explicit pchannels win over the configuration
    no_node = walsvc.load_config(environ={"WALSVC_WAL__MEMORY__NAME": "m"})
    assert no_node.pchannels is None
    with pytest.raises(InvalidArgument, match="WALSVC_NODE__PCHANNELS"):
        await walsvc.open_node_from_config(no_node)
    for text, says in [
        ("[wal.file]\npath = 'd'\n[node]\npchannels = []\n", "node.pchannels: Expected `array`"),
        ("[wal.file]\npath = 'd'\n[node]\npchannels = ['-x']\n", "node.pchannels[0]"),
        ("[wal.file]\npath = 'd'\n[node]\npins = 1\n", "unknown key 'node.pins'"),
    ]:
        with pytest.raises(InvalidArgument, match=re.escape(says)):
            walsvc.load_config(_write(tmp_path, text, "bad.toml"), environ={})
    with pytest.raises(InvalidArgument, match=r"unknown key 'node\.pchannel'"):
        walsvc.load_config(path, environ={"WALSVC_NODE__PCHANNEL": "p0"})
