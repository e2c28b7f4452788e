"""The flush job as a ``spark-submit`` application (spark-submit takes a ``.py`` file, not a
module): ``spark-submit --master spark://HOST:7077 $(python -c 'import walsvc.spark;
print(walsvc.spark.FLUSH_APP)') --url URL --pchannels p0,p1 --to PATH [--once]`` runs
``walsvc flush`` with the arguments after the file, on the master and with the
configuration spark-submit was given (an explicit ``--master`` argument still wins).

The driver and every executor must be able to ``import walsvc`` (installed in the
Python that ``PYSPARK_PYTHON`` names, which defaults to this interpreter).
"""

from __future__ import annotations

import os
import sys

__all__ = ("main",)


def main() -> int:
    """Run ``walsvc flush`` on ``sys.argv[1:]`` and return its exit status."""
    from walsvc.apps._cli import main as cli

    return cli(["flush", *sys.argv[1:]])


if __name__ == "__main__":
    # Run as a script, this file's directory (walsvc/apps) is sys.path[0]: drop it, so
    # that its private modules can never shadow top-level modules of the same name.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    raise SystemExit(main())
