"""The public surface: every public module declares a tuple ``__all__`` of names that
exist and are documented; every private module declares a tuple ``__all__`` too.

Public modules are found by walking the packages, so a new module cannot slip past.
Private modules are checked from their source (no import), so one whose optional
dependency is missing is still checked.
"""

from __future__ import annotations

import ast
import gc
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_PACKAGES = ("walsvc", "interceptors", "scanners")


def _module_files() -> dict[str, Path]:
    """Every module of the top packages, by dotted name, from the source tree."""
    found: dict[str, Path] = {}
    for top in TOP_PACKAGES:
        base = ROOT / top
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _compiled_modules() -> dict[str, Path]:
    """Every C extension module of the top packages (``name.c`` beside its ``name.pyi``
    stub), by dotted name, from the source tree."""
    found: dict[str, Path] = {}
    for top in TOP_PACKAGES:
        for path in sorted((ROOT / top).rglob("*.c")):
            found[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    return found


MODULES = _module_files()
COMPILED = _compiled_modules()
PUBLIC = sorted(
    name for name in MODULES if not any(part.startswith("_") for part in name.split("."))
)
PRIVATE = sorted(
    name for name in MODULES if name not in PUBLIC and not name.rsplit(".", 1)[-1].startswith("__")
)


def test_the_walk_finds_the_known_modules() -> None:
    assert {"walsvc", "walsvc.backends", "walsvc.testing", "scanners", "interceptors"} <= set(
        PUBLIC
    )
    assert {"walsvc.core._codec", "walsvc.wal._wal", "walsvc.backends._memory"} <= set(PRIVATE)


@pytest.mark.parametrize("top", TOP_PACKAGES)
def test_top_packages_are_regular_packages(top: str) -> None:
    """A directory without ``__init__.py`` imports as a namespace package with no
    ``__all__`` and no docstring."""
    assert (ROOT / top / "__init__.py").is_file(), f"{top}/__init__.py is missing"
    module = importlib.import_module(top)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve() == (ROOT / top / "__init__.py").resolve(), (
        f"{top} imports from {module.__file__}, not from this source tree"
    )


def _public_module(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", PUBLIC)
def test_public_module_has_a_documented_tuple_all(name: str) -> None:
    module = _public_module(name)
    assert inspect.getdoc(module), f"{name} has no module docstring"
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, tuple), f"{name}.__all__ must be a tuple, not {exported!r}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    for item in exported:
        assert isinstance(item, str)
        assert hasattr(module, item), f"{name}.__all__ names {item!r}, which does not exist"
        obj = getattr(module, item)
        if inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj):
            doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
            assert (doc or "").strip(), f"{name}.{item} has no docstring"
        else:
            assert _has_doc_comment(item), f"{name}.{item} has no '#:' doc comment"


@pytest.mark.parametrize("name", PUBLIC)
def test_public_classes_document_their_public_members(name: str) -> None:
    module = _public_module(name)
    missing = []
    for item in module.__all__:
        cls = getattr(module, item)
        if not inspect.isclass(cls):
            continue
        for attr, raw in vars(cls).items():
            if attr.startswith("_"):
                continue
            if not (
                inspect.isfunction(raw) or isinstance(raw, (classmethod, staticmethod, property))
            ):
                continue
            if not inspect.getdoc(getattr(cls, attr)):
                missing.append(f"{item}.{attr}")
    assert not missing, f"undocumented public members in {name}: {missing}"


def _parse(source: str, filename: str) -> ast.Module:
    """``ast.parse`` with the garbage collector paused: on CPython 3.11.7 a finalizer that
    runs while the AST is being built (here: clients left to the collector by earlier
    broker tests) can make ``ast.parse`` raise "SystemError: AST constructor recursion
    depth mismatch", seen twice in the full suite."""
    gc.collect()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        gc.enable()


@pytest.mark.parametrize("name", PRIVATE)
def test_private_module_has_a_tuple_all(name: str) -> None:
    tree = _parse(MODULES[name].read_text(), str(MODULES[name]))
    assert ast.get_docstring(tree), f"{name} has no module docstring"
    values = [
        node.value
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "__all__"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    assert len(values) == 1, f"{name} must assign __all__ exactly once"
    value = values[0]
    assert isinstance(value, ast.Tuple), f"{name}.__all__ must be a tuple literal"
    names = [elt.value for elt in value.elts if isinstance(elt, ast.Constant)]
    assert len(names) == len(value.elts), f"{name}.__all__ must list string literals"
    defined = _top_level_names(tree)
    for item in names:
        assert item in defined, f"{name}.__all__ names {item!r}, which it does not define"


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _has_doc_comment(constant: str) -> bool:
    """A module-level constant is documented by a ``#:`` comment right above it."""
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith((f"{constant} =", f"{constant}:")) and i > 0:
                if lines[i - 1].lstrip().startswith("#:"):
                    return True
    return False


def test_walk_packages_agrees_with_the_source_tree() -> None:
    """Importing the packages finds no module the source walk missed (a compiled module
    counts when its C source is in the tree)."""
    seen = set()
    for top in ("walsvc",):
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, f"{top}."):
            seen.add(info.name)
    known = set(MODULES) | set(COMPILED)
    assert seen <= known, f"modules outside the source tree: {seen - known}"


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_a_compiled_module_has_a_typed_stub(name: str) -> None:
    """mypy and readers see a C module through its ``.pyi`` stub, which names every
    function, class and constant the module defines."""
    stub = COMPILED[name].with_suffix(".pyi")
    assert stub.exists(), f"{name} has no stub {stub.name}"
    stubbed = set()
    for node in _parse(stub.read_text(), str(stub)).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    defined = {f for f in dir(importlib.import_module(name)) if not f.startswith("_")}
    assert defined == stubbed
