"""A griffe extension for the API reference: plain-text docstrings read right when rendered as Markdown.

The docstrings are written for ``help()`` and editors, where a list may start on the line right after a
sentence; Markdown folds such a list into the sentence unless a blank line comes first. This extension adds
that blank line when mkdocstrings loads the sources; the source files are not touched.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from griffe import Extension, Object

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")


def separate_lists(text: str) -> str:
    """``text`` with a blank line before each list item that follows a line of unindented prose."""
    lines: list[str] = []
    previous = ""
    for line in text.splitlines():
        prose_before = previous.strip() and not previous[0].isspace() and not LIST_ITEM.match(previous)
        if LIST_ITEM.match(line) and prose_before:
            lines.append("")
        lines.append(line)
        previous = line
    return "\n".join(lines)


class SeparateLists(Extension):
    """Applies ``separate_lists`` to every docstring griffe reads."""

    def on_instance(self, *, node: ast.AST | Any, obj: Object, agent: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = separate_lists(obj.docstring.value)
