"""An mkdocs hook: lists that follow a paragraph line render as lists, as on GitHub.

Python-Markdown starts a list only after a blank line; CommonMark (GitHub) lets a list
interrupt a paragraph. ARCHITECTURE.md (included by docs/architecture.md) and the pages
here are written for GitHub, so this preprocessor inserts the blank line before a list
item that follows a paragraph line, outside fenced code. It runs after the snippets
include (priority 32) and before fenced code is stashed (25).
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

_ITEM = re.compile(r"^(?:[-*+]|\d+[.)]) ")
_FENCE = re.compile(r"^\s*(```|~~~)")


class _ListsAfterParagraphs(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fence: str | None = None  # the fence of the code block the line is in
        in_list = False  # the lines since the last blank-line-led block are a list's
        for line in lines:
            after_blank = not out or not out[-1].strip()
            opened = _FENCE.match(line)
            if fence is not None:
                if opened and opened.group(1) == fence:
                    fence = None
            elif opened:
                fence = opened.group(1)
                in_list = in_list and line.startswith(" ")
            elif _ITEM.match(line):
                if not after_blank and not in_list:
                    out.append("")
                in_list = True
            elif line.strip() and not line.startswith(" ") and (after_blank or line[0] == "#"):
                in_list = False  # a paragraph, heading or table of its own
            out.append(line)
        return out


class _Lists(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        md.preprocessors.register(_ListsAfterParagraphs(md), "gfm_lists", 31)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(_Lists())
    return config
