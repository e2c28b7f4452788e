"""One line per failure: what a user sees on the terminal when a broker cannot be reached,
or when a broker deviation that walsvc handles shows up.

pulsar-client's C++ logger writes to the process's stdout (not through Python), and
aiokafka's lines reach stderr through logging's last resort; so every scenario runs in a
subprocess whose stdout and stderr are read whole. The two unreachable demos each wait
out the default ``connect_timeout`` (10 s, walsvc's retries: a broker may be starting),
so they run side by side, started by one fixture.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pulsar_lite import PulsarLite, broker, pchannel
from _tansu import start_tansu
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

import walsvc
from walsvc import Message
from walsvc.backends._kafka._client import HandledFaults, stop_quietly
from walsvc.backends._pulsar._client import LOG_ENV, LOG_LEVEL_ENV, client_logger

__all__ = ("broker",)

#: Bound on a subprocess (the demos take the 10 s connect_timeout): a guard, not a timing.
HANG = 60.0
DEMO = (sys.executable, "-m", "walsvc", "demo")


def _env(**extra: str) -> dict[str, str]:
    """This environment with the worktree's walsvc first on the path and pulsar-client's
    log as a user has it by default (unless ``extra`` sets it)."""
    root = str(Path(walsvc.__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k not in (LOG_ENV, LOG_LEVEL_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def _python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=HANG,
        check=False,
    )


#: Opens a WAL at argv[1] with a short connect_timeout; prints the error's type only.
OPEN = """
    import asyncio, sys, walsvc
    async def main():
        try:
            await walsvc.open_wal(sys.argv[1], "p", connect_timeout=1.0)
        except walsvc.BackendUnavailable:
            print("BackendUnavailable", flush=True)
    asyncio.run(main())
"""


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections (bound, not listening) for the module."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def unreachable_demos(
    closed_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """``walsvc demo`` on a pulsar:// and a kafka:// URL that refuse connections, both
    started at once (each takes the 10 s default connect_timeout); killed on exit."""
    cwd = tmp_path_factory.mktemp("demos")
    demos = {
        scheme: subprocess.Popen(
            [*DEMO, "--url", f"{scheme}://127.0.0.1:{closed_port}", "--messages", "10"],
            cwd=cwd,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for scheme in ("pulsar", "kafka")
    }
    try:
        yield demos
    finally:
        for demo in demos.values():
            if demo.poll() is None:
                demo.kill()
            demo.communicate()


def _finish(demo: subprocess.Popen[str]) -> tuple[int, list[str], list[str]]:
    out, err = demo.communicate(timeout=HANG)
    return demo.returncode, out.splitlines(), err.splitlines()


def test_unreachable_pulsar_url_is_one_error_line(
    unreachable_demos: dict[str, subprocess.Popen[str]], closed_port: int
) -> None:
    status, out, err = _finish(unreachable_demos["pulsar"])
    assert status == 2
    assert len(out) == 1, out  # no C++ client line on stdout
    assert out[0].startswith("walsvc demo: ")
    assert err == [
        f"error: cannot reach the Pulsar broker at pulsar://127.0.0.1:{closed_port} within"
        " 10.0 s (connect_timeout): a TCP connection to it was refused (nothing listens"
        " there)"
    ]


def test_unreachable_kafka_url_is_one_error_line(
    unreachable_demos: dict[str, subprocess.Popen[str]], closed_port: int
) -> None:
    status, out, err = _finish(unreachable_demos["kafka"])
    assert status == 2
    assert len(out) == 1, out
    assert out[0].startswith("walsvc demo: ")
    assert len(err) == 1, err  # no aiokafka "Unable connect to ..." line per attempt
    assert err[0].startswith(f"error: cannot reach Kafka at 127.0.0.1:{closed_port} (admin)")


def test_first_subscription_read_on_pulsar_lite_prints_nothing(broker: PulsarLite) -> None:
    """The first read of a subscription looks up the last id of the empty subscription
    topic, which Pulsar Lite answers with UnknownError (walsvc reads it as empty); the
    C++ client logged that as an ERROR line."""
    result = _python(
        """
        import asyncio, sys, walsvc
        from walsvc import DeliverPolicy, Message
        async def main():
            async with await walsvc.open_wal(sys.argv[1], sys.argv[2]) as wal:
                await wal.append(Message(payload=b"x", vchannel="v"))
                async with wal.read(DeliverPolicy.all(), subscription="s") as scanner:
                    async with asyncio.timeout(30):
                        await anext(scanner)
            print("read", flush=True)
        asyncio.run(main())
        """,
        broker.url,
        pchannel(),
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "read\n", "")


def test_pulsar_client_log_to_a_file(closed_port: int, tmp_path: Path) -> None:
    log = tmp_path / "pulsar-client.log"
    result = _python(OPEN, f"pulsar://127.0.0.1:{closed_port}", **{LOG_ENV: str(log)})
    assert (result.returncode, result.stdout, result.stderr) == (0, "BackendUnavailable\n", "")
    lines = log.read_text().splitlines()
    assert any(" INFO " in line for line in lines)  # the default level once turned on
    assert any(" ERROR " in line and "Connection refused" in line for line in lines)


def test_pulsar_client_log_on_the_console(closed_port: int) -> None:
    """The client's lines go to stdout, at the level asked for. Some may come after the
    failed open: the process's client lives on (``_clients``), and its lookup goes on
    retrying until its timeout or the client's shutdown at exit."""
    result = _python(
        OPEN, f"pulsar://127.0.0.1:{closed_port}", **{LOG_ENV: "console", LOG_LEVEL_ENV: "Error"}
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("BackendUnavailable") == 1, lines
    logged = [line for line in lines if line != "BackendUnavailable"]
    assert logged, lines
    assert all(" ERROR " in line for line in logged), lines


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({LOG_ENV: "console", LOG_LEVEL_ENV: "loud"}, "WALSVC_PULSAR_LOG_LEVEL must be one of"),
        ({LOG_ENV: "/nonexistent-dir/pulsar.log"}, "WALSVC_PULSAR_LOG: cannot open"),
    ],
)
def test_pulsar_client_log_settings_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(walsvc.InvalidArgument, match=message):
        client_logger(environ)


def test_kafka_connect_faults_are_debug_records(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """An application that logs aiokafka at DEBUG still sees each attempt's fault, at
    DEBUG; at WARNING it sees none."""

    async def open_unreachable() -> None:
        with pytest.raises(walsvc.BackendUnavailable):
            await walsvc.open_wal(f"kafka://127.0.0.1:{closed_port}", "p", connect_timeout=0.5)

    caplog.set_level(logging.WARNING)
    asyncio.run(open_unreachable())
    assert [r for r in caplog.records if r.name.startswith("aiokafka")] == []
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="aiokafka")
    asyncio.run(open_unreachable())
    faults = [r for r in caplog.records if r.getMessage().startswith("Unable connect to")]
    assert faults
    assert {r.levelname for r in faults} == {"DEBUG"}


async def test_a_kafka_outage_is_one_line_per_fault_not_a_flood(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through an outage aiokafka's fetcher and sender log a fault every few
    milliseconds while walsvc's reader and appends wait: the first of each passes (as a
    WARNING), the rest are DEBUG records; and the producer's messages that a stopping
    WAL gives up are not reported as futures never retrieved."""
    for name in ("aiokafka.consumer.fetcher", "aiokafka.producer.sender"):
        for handled in logging.getLogger(name).filters:
            if isinstance(handled, HandledFaults):
                handled._passed.clear()  # a fault of an earlier test may have passed
    caplog.set_level(logging.WARNING)
    broker = start_tansu()
    try:
        wal = await walsvc.open_wal(broker.url, "p0", connect_timeout=2, close_timeout=0.5)
        await wal.append(Message(payload=b"x", vchannel="v"))
        tail = wal.read()
        assert (await anext(tail)).payload == b"x"
        waiting = asyncio.ensure_future(anext(tail))
        broker.process.kill()  # a crash (a stop waits for the broker's own shutdown)
        broker.process.wait()
        for _ in range(3):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1):
                    await wal.append(Message(payload=b"y", vchannel="v"))
        waiting.cancel()
        await asyncio.wait([waiting])
        await tail.aclose()
        await wal.aclose()
    finally:
        broker.close()
    gc.collect()  # a future never retrieved is reported as it is collected
    faults = [(r.name, r.levelname, r.msg) for r in caplog.records]
    assert not [f for f in faults if f[0] == "asyncio"], faults
    produce = [f for f in faults if f[0] == "aiokafka.producer.sender"]
    assert produce == [("aiokafka.producer.sender", "WARNING", "Got error produce response: %s")]
    fetch = [f for f in faults if f[0] == "aiokafka.consumer.fetcher"]
    assert len(fetch) <= 1, fetch  # (the fetcher may be between fetches throughout)
    assert {f[1] for f in fetch} <= {"WARNING"}


@pytest.mark.parametrize("put_back", ["before", "after"])
async def test_a_batch_put_back_for_a_retry_is_failed_by_the_stop_without_an_error(
    put_back: str,
) -> None:
    """A stop in an outage fails a batch whose send failed, whether aiokafka's sender put
    it back in its queue for a retry before the stop, or puts it back after its backoff,
    during the stop: asyncio reports no error (the done callback of its first send,
    which removes it from the in-flight set, finds it there) and the put-back raises
    nothing (a ``KeyError`` would end the sender, and the stop would raise it).
    aiokafka's own accumulator, no broker: the put-back follows a retryable produce
    error in an outage, which no broker can be made to answer at a chosen moment."""
    reported: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")  # never started
    accumulator = producer._message_accumulator
    tp = TopicPartition("t", 0)
    message = await accumulator.add_message(tp, None, b"x", timeout=1)
    batch = accumulator._pop_batch(tp)  # the sender sends it
    if put_back == "before":
        accumulator.reenqueue(batch)  # its send failed: the sender's retry
    await stop_quietly(producer)
    for _ in range(3):
        await asyncio.sleep(0)  # the batch's done callbacks run
    if put_back == "after":
        accumulator.reenqueue(batch)  # the sender, after its backoff
    assert message.done()
    assert isinstance(message.exception(), KafkaError)
    assert not accumulator._pending_batches
    assert reported == []
