"""Before and after in one run: a figure measured on two source trees, alternately.

    python -m benchmarks.ab BASE_TREE NEW_TREE ROUNDS MODULE:FUNCTION [ARG ...]

Each round runs ``FUNCTION(*ARGS)`` (a function of a module of ``benchmarks``, returning
a dict of figures) once in a fresh process per tree, base first then new, with
``PYTHONPATH`` set to the tree, and prints both dicts; at the end, per figure, the best
of the rounds for each tree and new / base. Which figure is better when higher is the
function's business: ``best`` takes the maximum of figures named ``*_per_s`` or
``*rate*`` and the minimum of every other figure.

A base tree is made with ``git archive <commit> | tar -x -C DIR`` plus the compiled
modules copied in (the C sources must be the same).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _higher_is_better(name: str) -> bool:
    return name.endswith("_per_s") or "rate" in name


def main() -> None:
    base, new, rounds, target, *args = sys.argv[1:]
    results: dict[str, list[dict[str, float]]] = {base: [], new: []}
    for _ in range(int(rounds)):
        for tree in (base, new):
            env = dict(os.environ, PYTHONPATH=tree)
            code = (
                "import importlib, json, sys;"
                f"module, function = {target!r}.split(':');"
                "f = getattr(importlib.import_module('benchmarks.' + module), function);"
                f"print(json.dumps(f(*{args!r})))"
            )
            out = subprocess.run(
                [sys.executable, "-c", code],
                env=env,
                cwd=tree,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            results[tree].append(figures)
            print(f"{'base' if tree == base else 'new '}: {figures}", flush=True)
    for name in results[base][0]:
        pick = max if _higher_is_better(name) else min
        b = pick(r[name] for r in results[base])
        n = pick(r[name] for r in results[new])
        ratio = n / b if b else float("inf")
        print(f"{name}: base {b:.4g} new {n:.4g} new/base {ratio:.3f}")


if __name__ == "__main__":
    main()
