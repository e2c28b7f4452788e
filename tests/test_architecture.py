"""The architecture holds (issue 22): the import-linter contracts in pyproject.toml pass and
catch a forbidden import; nothing in the distribution imports the ``walsvc`` facade;
imports inside functions are only those on the allow-list below; any import order works;
the facade's names say they live in ``walsvc``.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import walsvc

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("walsvc", "interceptors", "scanners")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

#: Imports inside a function, each with why it cannot be at the top of its module:
#: (importing module, imported module).
DEFERRED_IMPORTS = {
    # The spark extra is optional: these modules import pyspark at their top, and the
    # data source class must be importable where only its name is needed.
    ("walsvc.spark", "walsvc.spark._source"),
    ("walsvc.spark", "walsvc.spark._workers"),
    ("walsvc.spark._source", "walsvc.spark._batch"),
    ("walsvc.spark._source", "walsvc.spark._stream"),
    ("walsvc.spark._source", "walsvc.spark._writer"),
    # `walsvc flush` without the spark extra says which extra to install.
    ("walsvc.apps._flush_command", "walsvc.spark"),
    # The metrics extra is optional: `walsvc serve --metrics-port` without it says which
    # extra to install, and every other command runs without it.
    ("walsvc.apps._serve_command", "walsvc.metrics"),
    # Run by spark-submit as a file: its directory is sys.path[0] until main() drops it.
    ("walsvc.apps._flush_app", "walsvc.apps._cli"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[ast.stmt, str, list[str], bool]]:
    """(node, absolute module, imported names, at module level) of every first-party
    import of module ``name``. Module level includes top-level ``if``/``try`` blocks."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top: set[int] = set()
    for node in tree.body:
        top.update(
            id(inner)
            for inner in ast.walk(node)
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        )
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            module, names = "", [alias.name for alias in node.names]
        else:
            continue
        targets = [module] if module else names
        if any(target.split(".")[0] in PACKAGES for target in targets):
            out.append((node, module, names, id(node) in top))
    return out


def test_nothing_in_the_distribution_imports_the_facade() -> None:
    """The facade imports (lazily) every layer; a module that imported it would depend on
    every layer above it."""
    offenders = []
    for name, path in MODULES.items():
        if name == "walsvc":
            continue
        for node, module, names, _ in _imports(name, path):
            if isinstance(node, ast.Import):
                offenders += [f"{name}: import {n}" for n in names if n == "walsvc"]
            elif module == "walsvc":
                offenders += [
                    f"{name}: from walsvc import {n}"
                    for n in names
                    if f"walsvc.{n}" not in MODULES and n != "_registry"
                ]
    assert offenders == []


def test_imports_inside_functions_are_the_allowed_ones() -> None:
    found = set()
    for name, path in MODULES.items():
        for _node, module, names, at_top in _imports(name, path):
            if at_top:
                continue
            targets = [module] if module else names
            found.update((name, target) for target in targets)
    assert found == DEFERRED_IMPORTS, "update DEFERRED_IMPORTS, with the reason, or hoist"


def test_the_import_contracts_hold() -> None:
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("importer", "imported", "contract"),
    [
        ("walsvc/core/_errors.py", "walsvc.wal._wal", "Layers: each imports only"),
        ("scanners/_reorder.py", "interceptors._dedup", "Layers: each imports only"),
        ("walsvc/backends/_file/_head.py", "walsvc.backends._kafka._ids", "independent"),
        ("walsvc/core/_filter.py", "threading", "The model does no I/O"),
    ],
)
def test_a_forbidden_import_breaks_a_named_contract(
    tmp_path: Path, importer: str, imported: str, contract: str
) -> None:
    """The contracts are not vacuous: one forbidden import, added to a copy of the tree,
    makes lint-imports fail and name the contract it breaks."""
    for top in PACKAGES:
        shutil.copytree(
            ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / importer
    target.write_text(target.read_text() + f"\nimport {imported}  # deliberately forbidden\n")
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr
    broken = [line for line in done.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(contract in line for line in broken), done.stdout


@pytest.mark.parametrize(
    "first", ["interceptors", "scanners", "walsvc.core._chain", "walsvc.testing", "walsvc.backends"]
)
def test_any_package_can_be_imported_first(first: str) -> None:
    """The facade loads its names on first use, so importing a lower package first never
    meets a half-initialised one."""
    code = (
        f"import {first}; import walsvc; walsvc.open_wal;"
        " import interceptors; interceptors.default_chain()"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_facade_exports_what_it_declares_for_type_checkers() -> None:
    """The names mypy sees (the TYPE_CHECKING imports) are the names that load."""
    tree = ast.parse((ROOT / "walsvc" / "__init__.py").read_text())
    declared = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                assert isinstance(inner, ast.ImportFrom)
                for alias in inner.names:
                    declared[alias.name] = inner.module
    loads = {name: module for module, names in walsvc._EXPORTS for name in names}
    assert declared == loads
    assert set(walsvc.__all__) == set(loads)


def test_errors_and_functions_say_they_live_in_walsvc() -> None:
    assert walsvc.WALFenced.__module__ == "walsvc"
    assert repr(walsvc.WALFenced("x")) == "WALFenced('x')"
    assert walsvc.open_wal.__module__ == "walsvc"
    with pytest.raises(walsvc.CorruptRecord) as caught:
        walsvc.unmarshal_message_id("not an id")
    assert type(caught.value).__module__ == "walsvc"
