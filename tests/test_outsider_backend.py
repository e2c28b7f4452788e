"""Issue 22, point 5: a backend written by an outsider, with public names only.

``_sqlite_backend`` stores pchannels in SQLite through ``walsvc``, ``walsvc.abc`` and
nothing private. These tests prove it passes the conformance kit every backend passes,
and keep the proof honest: its imports of walsvc (and of walsvc's sibling packages) must
all be public.
"""

from __future__ import annotations

import ast
from collections.abc import Awaitable
from pathlib import Path

import walsvc
from walsvc.testing import check_backend

BACKEND_SOURCE = Path(__file__).with_name("_sqlite_backend.py")
GUARDED_PACKAGES = ("walsvc", "interceptors", "scanners")

if "sqlite" not in walsvc.known_schemes():  # once per process: registering twice raises
    walsvc.register_backend("sqlite", "_sqlite_backend")


async def test_sqlite_backend_passes_the_conformance_kit(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'wal.db'}"

    def open_wal_for(pchannel: str, *, read_only: bool) -> Awaitable[walsvc.WAL]:
        return walsvc.open_wal(url, pchannel, read_only=read_only)

    await check_backend(open_wal_for, message_count=200, pchannels=2)


def private_imports(source: str) -> list[str]:
    """What ``source`` takes from a private module or name of a guarded package: by
    import, or by attribute through an imported module (``walsvc._registry``)."""
    found: list[str] = []
    aliases: set[str] = set()  # local names bound to guarded modules
    tree = ast.parse(source)
    for node in ast.walk(tree):
        modules: list[tuple[str, list[str]]]
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
            aliases.update(
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in GUARDED_PACKAGES
            )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in modules:
            parts = module.split(".")
            if parts[0] not in GUARDED_PACKAGES:
                continue
            if any(part.startswith("_") for part in parts):
                found.append(f"{module} (module)")
            found += [f"{module}.{name}" for name in names if name.startswith("_")]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                found.append(f"{ast.unparse(node)} (attribute)")
    return found


def test_the_sqlite_backend_imports_only_public_names() -> None:
    source = BACKEND_SOURCE.read_text()
    assert private_imports(source) == []
    assert "from walsvc.abc import" in source  # the check above looked at something


def test_the_import_check_catches_private_imports() -> None:
    assert private_imports(
        "import walsvc._x\nfrom walsvc.backends._memory import MemoryBackend\n"
        "from walsvc.abc import _hidden, Backend\nfrom interceptors import _y\n"
        "import os._private\nfrom . import _local\nos._exit\nwalsvc.abc.Backend\n"
        "walsvc.backends._registry.register_backend\n"
    ) == [
        "walsvc._x (module)",
        "walsvc.backends._memory (module)",
        "walsvc.abc._hidden",
        "interceptors._y",
        "walsvc.backends._registry (attribute)",
    ]
