"""The code the documentation shows, taken out of its Markdown to be run.

- Python blocks: their import statements, run in a fresh interpreter of this
  venv, so a snippet that names a moved or renamed module fails here first.
- Shell blocks (`sh`, `bash`, `shell`, `console`): every `gpu-pool` and
  `gpu-job` command line is parsed by the command's own parser (a flag that
  does not exist fails), lines ending in `--help` are run, and every `make`
  line must name a target of the Makefile.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)[^\n]*\n(.*?)^\1\s*$", re.S | re.M)
SHELL = {"sh", "bash", "shell", "console"}
COMMANDS = ("gpu-pool", "gpu-job")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    language: str
    code: str


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def snippets(path: Path) -> list[Snippet]:
    text = path.read_text()
    rel = path.relative_to(REPO).as_posix()
    return [Snippet(rel, text.count("\n", 0, m.start()) + 1, m.group(2).lower(), m.group(3))
            for m in FENCE.finditer(text)]


def python_imports(code: str) -> list[str]:
    """The import statements of a Python snippet (a snippet may `await` at top level)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        tree = ast.parse("\n".join(line for line in code.splitlines()
                                   if re.match(r"\s*(from\s+\S+\s+)?import\s", line)))
    return [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def shell_commands(code: str) -> list[list[str]]:
    """Each command line of a shell snippet as argv: continuations joined, prompts,
    comments and leading VAR=value assignments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        line = re.sub(r"^\s*\$\s+", "", line).strip()
        if not line or line.startswith("#"):
            continue
        try:
            argv = shlex.split(line, comments=True)
        except ValueError:
            continue  # a fragment (an unfinished quote across lines): not a command to check
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv:
            commands.append(argv)
    return commands


def checked_command(argv: list[str]) -> str | None:
    """The command's name when it is one the docs' checks know (`gpu-pool`, `gpu-job`, `make`)."""
    name = Path(argv[0]).name
    return name if name in (*COMMANDS, "make") else None


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.M))
