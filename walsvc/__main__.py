"""``python -m walsvc``: the same command line as the ``walsvc`` script."""

from __future__ import annotations

from walsvc.apps._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
