"""Whether this Swarm's managers can carry the generic-resource guard without killing servers.

`c.GPUSwarmSpawner.generic_resource_guard` asks Swarm to reserve the leased GPUs
as generic resources too.  Swarm's constraint enforcer, which runs on the
leading manager, re-checks every task on a node each time that node's record
changes.  Before Docker 23.0 its generic-resource check was inverted (moby/moby
issue 44378, fixed by moby/swarmkit pull request 3082): a task whose GPUs the
node does have is rejected, so at the node's next update every guarded task
there, running servers included, is shut down with "assigned node no longer
meets constraints".  Any manager may lead, so the guard is used only when every
manager runs a fixed engine; otherwise the spawner starts servers without the
reservation (the ledger still lends each GPU once) and says so, and `gpu-pool
doctor` reports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .lockdown import node_engine, node_name, version_tuple

FIXED_ENGINE = (23, 0)
RECHECK_SECONDS = 600.0  # managers are upgraded rarely; a hub notices within this


@dataclass(frozen=True)
class GuardVerdict:
    usable: bool
    detail: str  # which managers run which engine


def verdict_of(nodes: list[dict]) -> GuardVerdict:
    """From the manager's node list: usable only if every manager's engine is 23.0 or newer."""
    managers = [n for n in nodes if n.get("ManagerStatus") or (n.get("Spec") or {}).get("Role") == "manager"]
    old = [f"{node_name(n)} (Docker {node_engine(n) or '?'})" for n in managers
           if version_tuple(node_engine(n)) < FIXED_ENGINE]
    if not managers:
        return GuardVerdict(False, "no manager is listed")
    if old:
        return GuardVerdict(False, f"manager(s) {', '.join(old)} run a Docker older than 23.0, whose Swarm "
                                   "rejects tasks holding generic resources at their node's next update "
                                   "(moby/moby#44378)")
    return GuardVerdict(True, "every manager runs Docker 23.0 or newer")


class GuardCheck:
    """The verdict, looked up again every RECHECK_SECONDS (one per hub process)."""

    def __init__(self) -> None:
        self._verdict: GuardVerdict | None = None
        self._at = 0.0

    def verdict(self, client) -> GuardVerdict:
        now = time.monotonic()
        if self._verdict is None or now - self._at > RECHECK_SECONDS:
            self._verdict, self._at = verdict_of(client.nodes()), now
        return self._verdict


GUARD = GuardCheck()
