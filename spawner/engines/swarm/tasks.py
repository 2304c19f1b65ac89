"""Reading Swarm's tasks: which ones still hold a lease, and where a task can be reached.

Functions over the manager's answers (plus the calls that fetch them), shared by
the spawner and the reconciler.  A task holds its GPUs from the moment Swarm
creates it until its node reports it finished.  A node that goes quiet is not a
node that died: a task on a node that is down (or unknown, or disconnected) may
still run there, so it holds its GPUs for a grace period (`DOWN_NODES.grace`,
c.GPUSwarmSpawner.node_down_grace), counted from when this process first saw the
node quiet; only after it does the hub treat the task as gone.  A returning node
lends its GPUs only once the tasks it was told to stop meanwhile have stopped
(`withheld_gpus`, read by the Swarm inventory).
"""

from __future__ import annotations

import time

from ..common.labels import LABEL_GPUS, LABEL_LEASE, LABEL_POOL

# Task states in which the container may exist and run (Swarm's task life cycle up to running).
LIVE_TASK_STATES = frozenset({"new", "allocated", "pending", "assigned", "accepted", "preparing",
                              "ready", "starting", "running"})


class DownNodes:
    """Since when this process has seen each node not `ready`, and the grace period."""

    def __init__(self, grace: float = 300.0):
        self.grace = grace
        self._since: dict[str, float] = {}

    def note(self, states: dict[str, str]) -> None:
        now = time.monotonic()
        for node, state in states.items():
            if state == "ready":
                self._since.pop(node, None)
            else:
                self._since.setdefault(node, now)

    def quiet_for(self, node: str) -> float | None:
        """Seconds the node has been seen quiet (None: it is not)."""
        since = self._since.get(node)
        return None if since is None else time.monotonic() - since

    def in_grace(self, node: str) -> bool:
        quiet = self.quiet_for(node)
        return quiet is not None and quiet < self.grace


DOWN_NODES = DownNodes()


def node_states(client) -> dict[str, str]:
    """node id -> Status.State ("ready", "down", ...) from the manager (noted in DOWN_NODES)."""
    states = {n["ID"]: (n.get("Status") or {}).get("State", "unknown") for n in client.nodes()}
    DOWN_NODES.note(states)
    return states


def task_labels(task: dict) -> dict:
    return (((task.get("Spec") or {}).get("ContainerSpec") or {}).get("Labels")) or {}


def task_holds(task: dict, states: dict[str, str]) -> bool:
    """Whether the task's container may still run (see the module docstring): a live task on
    a ready node, or on a quiet node within the grace period."""
    if (task.get("Status") or {}).get("State") not in LIVE_TASK_STATES:
        return False
    node = task.get("NodeID")
    if not node or states.get(node, "ready") == "ready":
        return True
    return DOWN_NODES.in_grace(node)


def withheld_gpus(tasks: list[dict], states: dict[str, str]) -> set[str]:
    """GPU uuids named by tasks that were told to stop (their service removed or scaled down)
    but whose node has not reported them stopped: not lendable yet, though their lease ended."""
    held: set[str] = set()
    for task in tasks:
        if (task.get("Status") or {}).get("State") in LIVE_TASK_STATES and task.get("DesiredState") != "running":
            held.update(u for u in (task_labels(task).get(LABEL_GPUS) or "").split(",") if u)
    return held


def task_ip(task: dict, network: str) -> str | None:
    """The task's address on `network` (by name or id), without the prefix length."""
    for attachment in task.get("NetworksAttachments") or []:
        spec = attachment.get("Network") or {}
        if network in ((spec.get("Spec") or {}).get("Name"), spec.get("ID")):
            for address in attachment.get("Addresses") or []:
                return address.split("/")[0]
    return None


def lease_tasks(client, pool_id: str) -> list[dict]:
    """Every task (of any service, removed ones too) lent GPUs by the ledger `pool_id`."""
    return [t for t in client.tasks() if task_labels(t).get(LABEL_POOL) == pool_id
            and task_labels(t).get(LABEL_LEASE)]


def lease_holders_in(client, lease_id: int, pool_id: str) -> list[str]:
    """Names of services and tasks given `lease_id` that may still run (client: a docker APIClient)."""
    services = client.services(filters={"label": [f"{LABEL_LEASE}={lease_id}", f"{LABEL_POOL}={pool_id}"]})
    holders = [s["Spec"]["Name"] for s in services]
    states = node_states(client)
    for task in lease_tasks(client, pool_id):
        if task_labels(task).get(LABEL_LEASE) == str(lease_id) and task_holds(task, states):
            holders.append(f"task {task['ID'][:12]} on node {task.get('NodeID', '?')[:12]}")
    return holders
