"""The documentation holds together without building it (`make docs` builds the site with
``mkdocs build --strict``, which checks the site's own links and API references): every
page is in the nav, README's links resolve, README opens with the two set-up commands,
every Python example parses, and `make test` builds the site strictly."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

_ROOT = Path(__file__).resolve().parent.parent
_DOCS = _ROOT / "docs"
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)


def _pages() -> list[Path]:
    return sorted(p for p in _DOCS.rglob("*.md") if "_hooks" not in p.parts)


def _nav_pages(nav: object) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(value) for value in nav.values()))
    raise AssertionError(f"unexpected nav entry {nav!r}")


def _anchors(page: Path) -> set[str]:
    text = _FENCED.sub("", page.read_text())
    headings = re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}


def test_every_page_in_docs_is_in_the_nav() -> None:
    config = yaml.safe_load((_ROOT / "mkdocs.yml").read_text())
    listed = _nav_pages(config["nav"])
    pages = {p.relative_to(_DOCS).as_posix() for p in _pages()}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav entries without a page"


@pytest.mark.parametrize("name", ["README.md", "ARCHITECTURE.md", "benchmarks/README.md"])
def test_relative_links_resolve(name: str) -> None:
    """The repository's Markdown files that GitHub shows link to files (and headings)
    that exist; the site's own pages are checked by ``mkdocs build --strict``."""
    source = _ROOT / name
    text = _FENCED.sub("", source.read_text())
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve() if path else source
        assert resolved.exists(), f"{name}: link to {target} does not resolve"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{name}: no heading #{anchor} in {path}"


def test_the_readme_opens_with_the_two_set_up_commands() -> None:
    text = (_ROOT / "README.md").read_text()
    first = _FENCED.search(text)
    assert first is not None
    assert text[: first.start()].strip() == "# walsvc"
    commands = [line.split("#")[0].strip() for line in first.group().splitlines()[1:-1]]
    assert commands == ["make run", "make test"]


@pytest.mark.parametrize(
    "page", [_ROOT / "README.md", *_pages()], ids=lambda p: str(p.relative_to(_ROOT))
)
def test_the_python_examples_parse(page: Path) -> None:
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
        compile(block, str(page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_make_test_builds_the_docs_strictly() -> None:
    """``--quiet`` would hide the warnings, and ``--strict`` then lets a broken link pass."""
    makefile = (_ROOT / "Makefile").read_text()
    test_deps = re.search(r"^test:(.*)$", makefile, flags=re.M)
    assert test_deps is not None
    assert "docs" in test_deps.group(1).split()
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe is not None
    assert "mkdocs build --strict" in recipe.group(1)
    assert "--quiet" not in recipe.group(1)
    assert "-q " not in recipe.group(1)
