#!/usr/bin/env python3
"""The spawner package's import graph by floor, and the arrows that run back up against the
data flow (inventory -> pool -> spawner -> engine, then the apps that wire them together).

    .venv/bin/python tests/harness/layers.py          # rooms, floors, the upward arrows

A room is a package folder (or a loose module) one level under `spawner/` (under
`spawner/engines/`, one per engine and `common/`).  Its floor says where it stands in the data
flow; an arrow is "A imports B" between two rooms (at the top or inside a function), and it
runs *up* when A stands on a lower floor than B: the inventory knowing the pool, the pool
knowing a spawner, the spawner side (lending, jobs, ...) knowing an engine.
tests/unit/test_layout.py holds the package to at most two, each explained where it is made.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Floors, lowest first.  The apps (the hub's settings, the services, the CLI) stand on top:
# they pick an engine and hand each part what it needs.
FLOORS = {
    "inventory": 0,
    "pool": 1,
    # The spawner side: what lends (lending, profiles), runs jobs, tells and culls, and what
    # the engines' containers share with it (engines/common: names, labels, hardening).
    "lending": 2, "jobs": 2, "notify": 2, "culling": 2, "auth": 2, "profiles": 2, "identity": 2,
    "metrics": 2, "early_stop": 2, "services": 2, "engines.common": 2,
    "ssh.spawner_access": 2, "ssh.server_keys": 2,  # the spawner's side of SSH: its keys, its sshd
    "engines": 3, "engines.docker": 3, "engines.swarm": 3,
    # reauth: the services' re-check of a directory password (the pool page's, the SSH key page's).
    "settings": 4, "poolpage": 4, "ssh": 4, "cli": 4, "reauth": 4, "spawner": 4, "swarm": 4,
}


def room(module: str) -> str:
    """The room of `spawner.x.y...`: its longest prefix named in FLOORS (without `spawner.`)."""
    name = module.removeprefix("spawner.") if module != "spawner" else "spawner"
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return ".".join(parts[:n])
    raise KeyError(f"{module} stands on no floor: add its room to FLOORS in tests/harness/layers.py")


def rooms_and_arrows(graph: dict[str, set[str]]) -> tuple[set[str], set[tuple[str, str]], list[tuple[str, str]]]:
    """(rooms, arrows between rooms, upward module-level arrows (importer, imported))."""
    rooms = {room(m) for m in graph}
    arrows = {(room(m), room(d)) for m, deps in graph.items() for d in deps if room(m) != room(d)}
    upward = sorted((m, d) for m, deps in graph.items() for d in deps
                    if FLOORS[room(m)] < FLOORS[room(d)])
    return rooms, arrows, upward


def main() -> None:
    from tests.unit.test_layout import _spawner_graph

    graph = _spawner_graph()
    rooms, arrows, upward = rooms_and_arrows(graph)
    print(f"{len(graph)} modules, {len(rooms)} rooms on {len({FLOORS[r] for r in rooms})} floors, "
          f"{len(arrows)} arrows between rooms")
    for floor in sorted({FLOORS[r] for r in rooms}):
        print(f"  floor {floor}: {', '.join(sorted(r for r in rooms if FLOORS[r] == floor))}")
    pool_top = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "spawner" / "pool").iterdir()
                      if p.name not in ("__init__.py", "__pycache__"))
    print(f"spawner/pool/ top: {len(pool_top)} entries ({', '.join(pool_top)})")
    print(f"upward arrows: {len(upward)}")
    for m, d in upward:
        print(f"  {m} -> {d}")


if __name__ == "__main__":
    main()
