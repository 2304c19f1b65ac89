#!/usr/bin/env python3
"""Print the module map (docs/how-it-works/modules.md), generated from module docstrings.

Every module of the `spawner` package (and the images' server extension) is
listed with the first sentence of its docstring, so the map is as current as
the code; tests/unit/test_docs.py checks the page, and that every module has
a docstring to list:

    .venv/bin/python tests/harness/module_map.py --write
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.harness.generated import REPO, current, main, markers  # noqa: E402

PAGE = REPO / "docs" / "how-it-works" / "modules.md"
BEGIN, END = markers("module-map", "tests/harness/module_map.py")
ROOTS = [REPO / "spawner", REPO / "images" / "jupyter"]


def modules() -> list[Path]:
    found = []
    for root in ROOTS:
        found += [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(found, key=lambda p: p.relative_to(REPO).as_posix())


def summary(path: Path) -> str | None:
    """The docstring's first sentence (its first paragraph, joined), or None."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        return None
    paragraph = re.sub(r"\s+", " ", doc.strip().split("\n\n", 1)[0])
    return paragraph.replace("|", "\\|")


def reference() -> str:
    lines = [BEGIN, "", "| module | what it holds |", "|---|---|"]
    for path in modules():
        rel = path.relative_to(REPO).as_posix()
        lines.append(f"| `{rel}` | {summary(path) or '(no docstring)'} |")
    lines += ["", END]
    return "\n".join(lines)


def in_page() -> str:
    return current(PAGE, BEGIN, END)


if __name__ == "__main__":
    main(sys.argv, PAGE, BEGIN, END, reference)
