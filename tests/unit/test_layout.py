"""The house's rules that code review alone let slip: what ships never imports the tests,
and the ledger never reaches up into the spawner (data flows inventory -> pool -> spawner)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["spawner", "hub_config", "devservices", "images"]


def _imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = path.relative_to(REPO).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.add(node.module)
    return names


def test_nothing_shipped_imports_the_tests():
    offenders = [f"{path.relative_to(REPO)} imports {name}"
                 for top in SHIPPED for path in sorted((REPO / top).rglob("*.py"))
                 for name in _imports(path) if name == "tests" or name.startswith("tests.")]
    assert offenders == []


def test_the_ledger_imports_only_itself_and_the_inventory():
    allowed = ("spawner.pool", "spawner.inventory")
    offenders = [f"{path.relative_to(REPO)} imports {name}"
                 for path in sorted((REPO / "spawner" / "pool").rglob("*.py"))
                 for name in _imports(path)
                 if name.startswith("spawner") and not name.startswith(allowed)]
    assert offenders == []
