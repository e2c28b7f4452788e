"""Spark's Python workers and walsvc: a script run as ``.venv/bin/python script.py``
(venv not activated, ``PYSPARK_PYTHON`` unset) reads a log on a local master, and a
worker Python that cannot import walsvc is named when the data source is registered,
not deep inside Spark. Real local SparkSessions, real interpreters (a bare venv is the
Python without walsvc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path
from typing import Any

import pytest
from _spark import append_messages, spark

import walsvc
import walsvc.spark
from walsvc import Message
from walsvc.spark._workers import import_problem

__all__ = ("spark",)

REPO = Path(__file__).resolve().parent.parent
#: Seconds the script may take (a JVM start and one small read).
SCRIPT_TIMEOUT = 300


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose ``python3`` is a Python without walsvc or its dependencies."""
    home = tmp_path_factory.mktemp("bare-venv")
    venv.create(home, with_pip=False, symlinks=True)
    return home / "bin"


def test_a_script_outside_the_venv_reads_on_a_local_master(
    tmp_path: Path, bare_python: Path
) -> None:
    """Before: Spark planned the read in ``python3`` from PATH and failed with
    ``ModuleNotFoundError: No module named 'msgspec'``."""
    url = f"file://{tmp_path / 'wal'}"
    append_messages(url, "p0", [Message(payload=b"m%d" % i, vchannel="v") for i in range(5)])
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        import walsvc.spark

        spark = (SparkSession.builder.master("local[1]").appName("outside-the-venv")
                 .config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        walsvc.spark.register(spark)
        frame = spark.read.format("walsvc").option("url", {url!r}).option("pchannels", "p0")
        print("rows", frame.load().count())
        spark.stop()
        """)
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = f"{bare_python}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,  # as in the report: walsvc's sources are found, its dependencies not
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "rows 5"


def test_a_worker_python_without_walsvc_is_named_at_register(
    spark: Any, bare_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = str(bare_python / "python3")
    problem = import_problem(python)  # walsvc, or msgspec when run from the sources
    assert problem is not None
    assert problem.startswith("ModuleNotFoundError: No module named")
    assert import_problem(sys.executable) is None
    assert str(import_problem("no-such-python-here")).startswith("not found")
    # The session as it would be had PYSPARK_PYTHON named the bare Python at its start.
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python)
    with pytest.raises(walsvc.InvalidArgument) as caught:
        walsvc.spark.register(spark)
    message = str(caught.value)
    assert "PYSPARK_PYTHON" in message
    assert python in message
    assert problem in message
    assert sys.executable in message
