"""A Spark standalone cluster on loopback for integration tests: one master and one worker
started with ``spark-class`` from the pip-installed pyspark, each in its own process group,
ready once their logs say so, and stopped by pid (process group first, then the pid).

Nothing here skips: a missing Java, a process that exits or a log line that never comes
raises ``ClusterError`` with the log, and the caller's test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from walsvc.testing._tether import tethered

__all__ = (
    "QUICK_JVM",
    "ClusterError",
    "SparkCluster",
    "free_port",
    "spark_cluster",
    "spark_env",
    "spark_home",
    "stop_process",
)

#: Seconds a master or worker may take to say it is ready (JVM start on a busy machine).
READY_TIMEOUT = 120.0
#: Seconds a process gets to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT = 15.0
#: JVM options for the tests' Spark JVMs, which live seconds to minutes: the client
#: compiler only (no C2 threads competing with the jobs for two cores) and the serial
#: collector. Every Spark test module, one run each (2026-11-29): 367 s without, 317 s
#: with them in the subprocesses' JVMs only, 300 s with the in-process session's too.
#: The product leaves Spark's JVMs as they are.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class ClusterError(RuntimeError):
    """A cluster process did not start; the message carries its log."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env(**extra: str) -> dict[str, str]:
    """The environment for Spark processes of a test: loopback only, this interpreter
    (which has walsvc) for every Python worker, the pyspark package as SPARK_HOME, and
    ``QUICK_JVM`` for every JVM they start (drivers, daemons, the executors a worker
    launches; each says "Picked up JAVA_TOOL_OPTIONS" on its stderr)."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        JAVA_TOOL_OPTIONS=QUICK_JVM,
    )
    env.update(extra)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop ``process`` and its process group (it was started in a new session): SIGTERM,
    then SIGKILL after ``STOP_TIMEOUT`` seconds; reaps it."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)  # the group's leader is the process itself
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
    # Whatever else the group held (a Python worker a JVM forked) goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.process.poll() is not None:
                raise ClusterError(
                    f"spark {self.name} exited with status {self.process.returncode} before"
                    f" logging {needle!r}; its log ({self.log}):\n{self.text()[-6000:]}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"spark {self.name} did not log {needle!r} within {timeout:g} s; its log"
                    f" ({self.log}):\n{self.text()[-6000:]}"
                )
            time.sleep(0.2)


@dataclass
class SparkCluster:
    """A running master and worker; ``url`` is the master URL for ``--master``."""

    url: str
    master_web: int
    workdir: Path
    daemons: list[_Daemon] = field(default_factory=list)

    def logs(self) -> str:
        """Every daemon's log, for a failure message."""
        return "\n".join(f"--- {d.name} ({d.log})\n{d.text()[-6000:]}" for d in self.daemons)

    def pids(self) -> list[int]:
        """The pids of the master and the worker."""
        return [d.process.pid for d in self.daemons]

    def close(self) -> None:
        """Stop the worker, then the master, by pid and process group."""
        for daemon in reversed(self.daemons):
            stop_process(daemon.process)


def _start(name: str, args: Sequence[str], workdir: Path, env: Mapping[str, str]) -> _Daemon:
    log = workdir / f"{name}.log"
    spark_class = spark_home() / "bin" / "spark-class"
    command, fds = tethered([str(spark_class), *args])
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=workdir,
            start_new_session=True,
        )
    return _Daemon(name, process, log)


@contextlib.contextmanager
def spark_cluster(
    workdir: Path, *, cores: int = 1, memory: str = "1g", timeout: float = READY_TIMEOUT
) -> Iterator[SparkCluster]:
    """A master and one worker (``cores``, ``memory``) on 127.0.0.1 free ports, ready
    (the worker registered with the master) when the block starts, stopped by pid when
    it ends, however it ends."""
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ClusterError("a Spark cluster needs Java 17+ on PATH (or JAVA_HOME); none found")
    workdir.mkdir(parents=True, exist_ok=True)
    env = spark_env(SPARK_LOG_DIR=str(workdir), SPARK_WORKER_DIR=str(workdir / "work"))
    port, web = free_port(), free_port()
    cluster = SparkCluster(url=f"spark://127.0.0.1:{port}", master_web=web, workdir=workdir)
    try:
        master = _start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(web),
            ],
            workdir,
            env,
        )
        cluster.daemons.append(master)
        master.wait_for("I have been elected leader", timeout)
        worker = _start(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                cluster.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--work-dir",
                str(workdir / "work"),
            ],
            workdir,
            env,
        )
        cluster.daemons.append(worker)
        worker.wait_for("Successfully registered with master", timeout)
        yield cluster
    finally:
        cluster.close()
