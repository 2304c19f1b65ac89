"""The house's rules that code review alone let slip: what ships never imports the tests,
and the ledger never reaches up into the spawner (data flows inventory -> pool -> spawner)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What ships, and what runs beside it (the demos in devservices/, the benchmarks): none imports tests/.
SHIPPED = ["spawner", "hub_config", "devservices", "images", "bench"]


def _import_statements(path: Path):
    """(module, names) of each import in a file, relative ones resolved against its package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    package = parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield ".".join([*base, node.module] if node.module else base), tuple(a.name for a in node.names)
            elif node.module:
                yield node.module, tuple(a.name for a in node.names)


def _imports(path: Path) -> set[str]:
    """Absolute module names a file imports."""
    return {module for module, _ in _import_statements(path)}


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


def _spawner_graph() -> dict[str, set[str]]:
    """spawner's modules -> the spawner modules they import (at the top or inside a function)."""
    files = {}
    for path in (REPO / "spawner").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in files.items():
        deps = set()
        for imported, names in _import_statements(path):
            if not imported.startswith("spawner"):
                continue
            # `from package import module` names that module; any other name, its module.
            submodules = [f"{imported}.{n}" for n in names if f"{imported}.{n}" in files]
            deps.update(submodules if submodules and len(submodules) == len(names) else
                        [*submodules, known(imported)])
        graph[module] = deps - {module, ""}
    return graph


def test_spawner_has_no_import_circle():
    graph = _spawner_graph()
    circles = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                walk(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert circles == []


def test_every_package_install_goes_through_the_one_installer():
    # Two installers side by side meet dpkg's lock; one that does not wait for it fails.
    # Dockerfiles install inside their build container, not on this machine.
    offenders = []
    candidates = [REPO / "Makefile", *(REPO / ".ci").glob("*")]
    for folder in (*SHIPPED, "bench"):
        candidates += (REPO / folder).rglob("*")
    for path in sorted(candidates):
        rel = path.relative_to(REPO).as_posix()
        if (not path.is_file() or "__pycache__" in rel or path.name.startswith("Dockerfile")
                or rel == "devservices/apt-install.sh" or path.suffix not in ("", ".sh", ".py")):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        python = path.suffix == ".py" or text.startswith("#!/usr/bin/env python")
        for number, line in enumerate(text.splitlines(), 1):
            if python:  # a subprocess argv: ["apt-get", "install", ...] or ["dpkg", "-i", ...]
                found = re.search(r"[\"']apt-get[\"']\s*,\s*[\"']install|[\"']dpkg[\"']\s*,\s*[\"']-i", line)
            else:  # a shell command line, not a message that names one
                code = line.split("#", 1)[0]
                found = "echo" not in code and re.search(r"\bapt-get\s+(-\S+\s+)*install\b|\bdpkg\s+-i\b", code)
            if found:
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "install through devservices/apt-install.sh:\n" + "\n".join(offenders)


def test_every_module_on_the_machines_one_swarm_is_in_its_work_unit():
    # A module that starts the Swarm outside the unit stops an xdist run at collection, and the
    # controller says only "INTERNALERROR ... crashitem" (what a merge of two branches once did).
    from tests.conftest import FIXED_PORT_UNITS

    _, listed = FIXED_PORT_UNITS["swarm"]
    users = {f"tests/integration/{p.name}" for p in sorted((REPO / "tests" / "integration").glob("test_*.py"))
             if re.search(r"\b(swarm_cluster|make_swarm_hub)\b", p.read_text())}
    assert users == set(listed)


def test_the_pool_has_a_few_rooms_that_never_reach_up_into_the_spawner():
    pool = REPO / "spawner" / "pool"
    entries = sorted(p.name for p in pool.iterdir() if p.name not in ("__init__.py", "__pycache__"))
    assert len(entries) <= 8, entries
    offenders = [f"{path.relative_to(REPO)} imports {name}"
                 for room in pool.iterdir() if room.is_dir() and room.name != "__pycache__"
                 for path in sorted(room.rglob("*.py")) for name in _imports(path)
                 if name.startswith("spawner") and not name.startswith(("spawner.pool", "spawner.inventory"))]
    assert offenders == []


def _arrows(graph, importer: str, imported: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {d}" for m, deps in graph.items() if m == importer or m.startswith(importer + ".")
                  for d in deps if d.startswith(imported))


def test_no_engine_imports_its_sibling():
    graph = _spawner_graph()
    assert _arrows(graph, "spawner.engines.docker", ("spawner.engines.swarm",)) == []
    assert _arrows(graph, "spawner.engines.swarm", ("spawner.engines.docker",)) == []
    # What both stand on imports neither.
    assert _arrows(graph, "spawner.engines.common", ("spawner.engines.docker", "spawner.engines.swarm")) == []


def test_the_jobs_package_imports_no_engine():
    # The gpu-pool service hands the runner its units' engine (engines.make_job_engine).
    graph = _spawner_graph()
    assert _arrows(graph, "spawner.jobs", ("spawner.engines.docker", "spawner.engines.swarm")) == []
    assert "spawner.engines" not in {d for m, deps in graph.items() if m.startswith("spawner.jobs") for d in deps}


def test_nothing_below_the_engines_imports_them():
    # The pool and the inventory stand below every engine.  The one exception is named, with
    # its reason in its module (inventory/swarm.py: a task's GPUs are never offered).
    graph = _spawner_graph()
    below = (_arrows(graph, "spawner.pool", ("spawner.engines",))
             + _arrows(graph, "spawner.inventory", ("spawner.engines",)))
    assert below == ["spawner.inventory.swarm imports spawner.engines.swarm.tasks"]


def test_at_most_two_arrows_run_up_against_the_data_flow():
    from tests.harness.layers import rooms_and_arrows

    _, _, upward = rooms_and_arrows(_spawner_graph())
    assert len(upward) <= 2, upward


def _foreign_privates(path: Path) -> list[str]:
    """`x._name` in a file where x is not self or cls: a reach into another object's private member."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
    return found


def test_the_jobs_runner_drives_every_job_as_one_group():
    # A plain job is a group of one unit, a cluster one of N (jobs/group.py): the runner has no
    # cluster-only path, and no part of the jobs package reaches into another's private members
    # (a cluster once did, taking the runner and its `_cancel`).
    runner = REPO / "spawner" / "jobs" / "runner.py"
    tree = ast.parse(runner.read_text())
    branches = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "is_cluster"]
    assert branches == [], f"runner.py branches on is_cluster at lines {branches}"
    assert "spawner.jobs.cluster" not in _imports(runner)
    offenders = [hit for path in sorted((REPO / "spawner" / "jobs").rglob("*.py")) for hit in _foreign_privates(path)]
    assert offenders == []


def test_the_pools_fair_use_check_is_the_jobs_runners_only_fair_use_rule():
    # The runner asks the pool which jobs its fair use stops (pool/fair_use/stops.py); it keeps no
    # budget or booking rule of its own, nor the culler's.
    jobs = REPO / "spawner" / "jobs"
    assert not (jobs / "fair_use.py").exists()
    offenders = [f"{path.relative_to(REPO)} imports {name}" for path in sorted(jobs.rglob("*.py"))
                 for name in _imports(path) if name.startswith("spawner.culling")]
    assert offenders == []
    assert "spawner.pool.fair_use.stops" in _imports(jobs / "runner.py")
