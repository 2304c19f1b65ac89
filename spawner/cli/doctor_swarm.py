"""`gpu-pool doctor` on a Swarm manager: one line per node, ok / warn / FAIL and the fix.

For each node: whether its servers run with no-new-privileges (the service spec
carries it from Docker 25 on; on older nodes a probe task checks the node's
daemon, as the hub does before it places a server: spawner/engines/swarm/lockdown.py),
and whether the GPUs its agent's NVML sees (`gpu-pool agent` readings in the
ledger) are the ones it advertises to Swarm as generic resources.
"""

from __future__ import annotations

from .doctor_checks import FAIL, OK, WARN, Result

AGENT_FIX = ("run `gpu-pool agent` on node {node} (the per-node agent service), so its NVML "
             "readings reach the ledger")
GENERIC_FIX = ("list exactly the GPUs nvidia-smi shows in node {node}'s daemon.json "
               '("node-generic-resources": ["GPU=GPU-<uuid>", ...]) and restart its dockerd')


def node_result(node: dict, manager_api: str, verdict, seen: set[str] | None) -> Result:
    """The line of one node: lock-down first (a FAIL there refuses servers), then its GPUs.

    `verdict`: the probe's (lockdown.Verdict) or None when the spec carries the flag;
    `seen`: the uuids of the node's fresh agent readings (None: the ledger was not read)."""
    from ..engines.swarm.lockdown import FIX, node_engine, node_name, spec_carries_it
    from ..inventory.swarm import node_gpus

    name = node_name(node)
    engine = node_engine(node) or "?"
    state = (node.get("Status") or {}).get("State", "unknown")
    availability = (node.get("Spec") or {}).get("Availability", "?")
    advertised = set(node_gpus(node))
    head = f"Docker {engine}, {state}/{availability}, {len(advertised)} GPU(s) advertised"
    check = f"node {name}"
    if state != "ready" or availability != "active":
        return Result(check, WARN, f"{head}: no server is placed there now; not checked",
                      f"bring node {name} back (docker node update --availability active {name})")
    if spec_carries_it(manager_api, engine):
        lockdown = "services carry no-new-privileges (Docker 25+)"
    elif verdict is None or verdict.enforced is None:
        why = verdict.detail if verdict is not None else "not probed"
        return Result(check, WARN, f"{head}: no-new-privileges unknown ({why}); the hub places no server there",
                      f"make the servers' image run on node {name}, then run gpu-pool doctor again")
    elif not verdict.enforced:
        return Result(check, FAIL, f"{head}: {verdict.detail}; the hub places no server there",
                      FIX.format(node=name))
    else:
        lockdown = "its daemon enforces no-new-privileges (probe task)"
    if not advertised:
        return Result(check, OK, f"{head}: {lockdown}; no GPUs (CPU servers only)")
    if seen is None:
        return Result(check, OK, f"{head}: {lockdown}; its GPUs were not compared (no ledger)")
    if not seen:
        return Result(check, WARN, f"{head}: {lockdown}; no fresh agent reading, so its GPUs are unchecked",
                      AGENT_FIX.format(node=name))
    if seen != advertised:
        extra, missing = sorted(seen - advertised), sorted(advertised - seen)
        detail = "; ".join(filter(None, (f"NVML sees {', '.join(extra)} not advertised" if extra else "",
                                         f"advertised {', '.join(missing)} that NVML does not see" if missing else "")))
        return Result(check, FAIL, f"{head}: {lockdown}; {detail}", GENERIC_FIX.format(node=name))
    return Result(check, OK, f"{head}: {lockdown}; its agent's NVML sees the same GPUs")


def guard_result(nodes: list[dict]) -> Result:
    """c.GPUSwarmSpawner.generic_resource_guard is on: whether every manager can carry it."""
    from ..engines.swarm.generic_guard import verdict_of

    verdict = verdict_of(nodes)
    if verdict.usable:
        return Result("generic-resource guard", OK, f"{verdict.detail}: servers also reserve their GPUs in Swarm")
    return Result("generic-resource guard", WARN,
                  f"{verdict.detail}: the hub starts servers without the reservation (the ledger still lends "
                  "each GPU once)", "upgrade every Swarm manager to Docker 23.0 or newer")


def node_results(api, image: str | None, prefix: str, readings, log, guard: bool = False) -> list[Result]:
    """Every node's line (api: a docker APIClient on the manager; readings: {(host, uuid): Reading} or None),
    after the generic-resource guard's when it is configured."""
    from ..engines.swarm.lockdown import LOCKDOWN, node_name, spec_carries_it

    manager_api = api.version().get("ApiVersion", "")
    nodes = api.nodes()
    live = [n for n in nodes if (n.get("Status") or {}).get("State") == "ready"
            and (n.get("Spec") or {}).get("Availability") == "active"
            and not spec_carries_it(manager_api,
                                    ((n.get("Description") or {}).get("Engine") or {}).get("EngineVersion"))]
    verdicts = LOCKDOWN.verdicts(api, live, image, prefix, log) if live and image else {}
    results = [guard_result(nodes)] if guard else []
    for node in sorted(nodes, key=node_name):
        seen = None if readings is None else {u for (h, u) in readings if h == node_name(node)}
        results.append(node_result(node, manager_api, verdicts.get(node["ID"]), seen))
    return results
