"""Which Python Spark's workers run, and whether it can run the ``walsvc`` data source.

Spark starts every Python worker (the executors' readers and writers, and the
driver-side process that plans a Python data source's reads) with the interpreter
``SparkContext.pythonExec`` names: ``PYSPARK_PYTHON`` as it was when the context
started, else ``python3`` from ``PATH``. A script run as ``.venv/bin/python script.py``
without the venv activated thus plans its reads in a ``python3`` that lacks walsvc, and
fails deep inside Spark (``ModuleNotFoundError: No module named 'msgspec'``).
``check_workers`` settles that when the data source is registered.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Final

from walsvc.core._errors import InvalidArgument

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ("check_workers", "import_problem")

#: Run by the candidate interpreter: what a worker imports first (walsvc and its core
#: dependencies), and pyarrow found (its import alone takes longer than all the rest).
_PROBE: Final = (
    "import importlib.util, sys, walsvc\n"
    "if importlib.util.find_spec('pyarrow') is None:\n"
    "    sys.exit(\"ModuleNotFoundError: No module named 'pyarrow'\")\n"
)
#: Seconds the probe may take (an interpreter start and ``import walsvc``: ~0.2 s here).
_PROBE_TIMEOUT: Final = 60.0
#: Interpreters that passed the probe in this process, by path.
_GOOD: Final[set[str]] = set()


def check_workers(spark: SparkSession) -> None:
    """Make sure ``spark``'s Python workers can import walsvc, or raise.

    With a local master (``local``, ``local[*]``, ...) and ``PYSPARK_PYTHON`` unset, the
    workers are pointed at this interpreter (``sys.executable``), which has walsvc. Any
    other case probes the worker interpreter on this machine (one subprocess, about
    0.2 s, once per interpreter and process) and raises ``InvalidArgument`` naming
    ``PYSPARK_PYTHON`` if it cannot import walsvc; with a non-local master an interpreter
    this machine does not have is not checked (it may exist on the executors' machines).
    """
    context = spark.sparkContext
    configured = os.environ.get("PYSPARK_PYTHON")
    master = context.master or ""
    local = master.startswith("local")
    if local and configured is None:
        context.pythonExec = sys.executable
        return
    python = context.pythonExec
    if python == sys.executable:
        return
    problem = import_problem(python)
    if problem is None or (not local and problem.startswith("not found")):
        return
    source = "PYSPARK_PYTHON" if configured is not None else "PYSPARK_PYTHON unset: from PATH"
    raise InvalidArgument(
        f"Spark's Python workers (master {master}) run {python!r} ({source}),"
        f" which cannot run the walsvc data source: {problem}. Set PYSPARK_PYTHON, before"
        " the SparkSession starts, to a Python with walsvc[spark] installed on every"
        f" machine that runs an executor (this one: {sys.executable})"
    )


def import_problem(python: str) -> str | None:
    """Why the interpreter ``python`` (a path, or a name looked up on ``PATH``) cannot
    run the walsvc data source: ``"not found ..."`` if there is no such interpreter here,
    else the last line of its import error; None if it can."""
    path = shutil.which(python)
    if path is None:
        return f"not found on this machine (PATH={os.environ.get('PATH', '')})"
    if path in _GOOD:  # not resolved: a venv's python is a link to the bare one
        return None
    try:
        done = subprocess.run(
            [path, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode == 0:
        _GOOD.add(path)
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"it exited with status {done.returncode}"
