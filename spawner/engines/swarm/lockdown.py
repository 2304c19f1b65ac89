"""Whether each Swarm node runs its tasks with no-new-privileges, checked on the node itself.

On one host the spawner asks Docker for `no-new-privileges` per container.  A
Swarm service can carry it only from Docker Engine API 1.44 on (Docker 25:
`ContainerSpec.Privileges.NoNewPrivileges`), and only a node whose own engine
is that new honours it; an older node ignores the field without a word.  There
the node's daemon must enforce it for every container (`"no-new-privileges":
true` in its daemon.json).  Nothing on the manager says whether a node's daemon
does, so the hub looks: a probe task on every node (a global service that runs
`grep NoNewPrivs /proc/self/status` as nobody, with the servers' lock-down and
no GPU) exits 0 only where the flag is set, which is exactly what a server
there would get.  The hub places servers only on nodes whose probe passed
(`GPUSwarmSpawner` and `gpu-pool doctor` read the same verdicts).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from ..common.labels import PREFIX

# The Engine API (on the manager) whose service specs carry no-new-privileges, and the
# Docker Engine (on each node) that honours it.
SPEC_API = (1, 44)
SPEC_ENGINE = (25, 0)
LABEL_PROBE = f"{PREFIX}.lockdown-probe"
PROBE_SECONDS = 30.0  # a probe that has not ended by then leaves its nodes unknown
# How long a verdict is kept: a node that passed is looked at again now and then (its daemon
# may have been reconfigured); one that failed or could not be probed, soon.
PASSED_TTL = 600.0
FAILED_TTL = 30.0
FIX = ('add "no-new-privileges": true to /etc/docker/daemon.json on node {node} and restart its dockerd '
       "(or upgrade the Swarm to Docker 25 or newer, whose services carry it)")


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'20.10.24+dfsg1' -> (20, 10, 24); '1.44' -> (1, 44); unreadable parts end it."""
    parts = []
    for piece in (text or "").split("+")[0].split("-")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def spec_carries_it(manager_api: str | None, engine_version: str | None) -> bool:
    """Whether a service spec's NoNewPrivileges reaches a task on a node with this engine."""
    return version_tuple(manager_api) >= SPEC_API and version_tuple(engine_version) >= SPEC_ENGINE


def node_name(node: dict) -> str:
    return (node.get("Description") or {}).get("Hostname", "") or node.get("ID", "?")[:12]


def node_engine(node: dict) -> str:
    return ((node.get("Description") or {}).get("Engine") or {}).get("EngineVersion", "")


@dataclass(frozen=True)
class Verdict:
    """What the probe found on one node: enforced True / False / None (could not tell)."""

    enforced: bool | None
    detail: str
    at: float

    def fresh(self, now: float) -> bool:
        return now - self.at < (PASSED_TTL if self.enforced else FAILED_TTL)


def verdict_of(task: dict | None, now: float) -> Verdict:
    """A probe task's verdict: `complete` (grep found the flag) or `failed` with exit 1 (it did not)."""
    if task is None:
        return Verdict(None, "no probe task ran there (drained, or not eligible)", now)
    status = task.get("Status") or {}
    state = status.get("State", "")
    code = (status.get("ContainerStatus") or {}).get("ExitCode")
    if state == "complete":
        return Verdict(True, "its tasks run with no-new-privileges (checked by a probe task)", now)
    if state == "failed" and code == 1:
        return Verdict(False, "its tasks run WITHOUT no-new-privileges (a probe task found NoNewPrivs: 0)", now)
    why = status.get("Err") or status.get("Message") or state or "no state"
    return Verdict(None, f"its probe task did not tell ({state}: {why})", now)


def probe_spec(image: str, manager_api: str) -> dict:
    """The probe service's task template: a server's lock-down, nobody, no GPU, no network, no restart."""
    from docker.types import ContainerSpec, Resources, RestartPolicy, TaskTemplate

    from ..common.containers import HELPER_PIDS_LIMIT, hardened_host_config

    spec = ContainerSpec(image=image,
                         command=["/bin/sh", "-c", "grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/self/status"],
                         user="65534:65534", env={"NVIDIA_VISIBLE_DEVICES": "void"},
                         labels={LABEL_PROBE: "1"}, cap_drop=hardened_host_config()["cap_drop"])
    if version_tuple(manager_api) >= SPEC_API:
        # Where the spec can carry it the probe asks for it too: then it checks what the node honours.
        spec["Privileges"] = {"NoNewPrivileges": True}
    resources = Resources()
    resources["Limits"] = {"Pids": HELPER_PIDS_LIMIT}
    return TaskTemplate(container_spec=spec, resources=resources, restart_policy=RestartPolicy(condition="none"))


class NodeLockdown:
    """The probe's verdict per node id, kept a while (see the module docstring); one probe at a time."""

    def __init__(self):
        self._verdicts: dict[str, Verdict] = {}
        self._lock = threading.Lock()

    def known(self) -> dict[str, Verdict]:
        return dict(self._verdicts)

    def forget(self) -> None:
        self._verdicts.clear()

    def verdicts(self, client, nodes: list[dict], image: str, prefix: str, log) -> dict[str, Verdict]:
        """node id -> fresh verdict for every node in `nodes`, probing those without one (blocking)."""
        with self._lock:
            now = time.monotonic()
            stale = [n for n in nodes if not (v := self._verdicts.get(n["ID"])) or not v.fresh(now)]
            if stale:
                self._verdicts.update(probe(client, stale, image, prefix, log))
            return {n["ID"]: self._verdicts[n["ID"]] for n in nodes if n["ID"] in self._verdicts}


def probe(client, nodes: list[dict], image: str, prefix: str, log) -> dict[str, Verdict]:
    """Run the probe on `nodes` (a global service limited to them) and read each node's verdict."""
    manager_api = client.version().get("ApiVersion", "")
    wanted = {n["ID"] for n in nodes}
    name = f"{prefix}-lockdown-probe-{int(time.time() * 1000) % 10**9}"
    service = None
    tasks: list[dict] = []
    try:
        service = client.create_service(probe_spec(image, manager_api), name=name, mode={"Global": {}},
                                        labels={LABEL_PROBE: "1"})
        deadline = time.monotonic() + PROBE_SECONDS
        while time.monotonic() < deadline:
            tasks = [t for t in client.tasks(filters={"service": name}) if t.get("NodeID") in wanted]
            ended = {t["NodeID"] for t in tasks if (t.get("Status") or {}).get("State") in
                     ("complete", "failed", "rejected", "shutdown", "orphaned")}
            if ended >= wanted:
                break
            time.sleep(0.1)
    except Exception as exc:  # unknown everywhere: nothing is placed on an unchecked node
        log.error("Could not probe the Swarm nodes for no-new-privileges: %s", exc)
        now = time.monotonic()
        return {node: Verdict(None, f"the probe could not run ({exc})", now) for node in wanted}
    finally:
        if service is not None:
            try:
                client.remove_service(service["ID"])
            except Exception as exc:
                log.warning("Could not remove the probe service %s: %s", name, exc)
    now = time.monotonic()
    found = {n: verdict_of(next((t for t in tasks if t.get("NodeID") == n), None), now) for n in wanted}
    for node in nodes:
        verdict = found[node["ID"]]
        if verdict.enforced is not True:
            log.error("Swarm node %s: %s; no server is placed there. Fix: %s", node_name(node), verdict.detail,
                      FIX.format(node=node_name(node)))
    return found


LOCKDOWN = NodeLockdown()


async def refused_nodes(client, image: str, prefix: str, log) -> dict[str, tuple[str, str]]:
    """node id -> (hostname, why) of the ready, active nodes where a server would run without
    no-new-privileges, or where that could not be checked."""
    def look():
        nodes = [n for n in client.nodes() if (n.get("Status") or {}).get("State") == "ready"
                 and (n.get("Spec") or {}).get("Availability") == "active"]
        manager_api = client.version().get("ApiVersion", "")
        unsure = [n for n in nodes if not spec_carries_it(manager_api, node_engine(n))]
        verdicts = LOCKDOWN.verdicts(client, unsure, image, prefix, log) if unsure else {}
        return {n["ID"]: (node_name(n), verdicts[n["ID"]].detail if n["ID"] in verdicts else "not probed")
                for n in unsure if not (n["ID"] in verdicts and verdicts[n["ID"]].enforced)}

    return await asyncio.to_thread(look)
