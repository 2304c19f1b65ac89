"""Reading Swarm's tasks: which ones still hold a lease, and where a task can be reached.

Pure functions over the manager's answers (plus the calls that fetch them),
shared by the spawner and the reconciler.  A task holds its GPUs from the
moment Swarm creates it until its node reports it finished; a task on a node
that is down holds nothing the hub can see (its GPUs are not lent while the
node is down, and a returning node stops the tasks of removed services).
"""

from __future__ import annotations

from ..labels import LABEL_LEASE, LABEL_POOL

# Task states in which the container may exist and run (Swarm's task life cycle up to running).
LIVE_TASK_STATES = frozenset({"new", "allocated", "pending", "assigned", "accepted", "preparing",
                              "ready", "starting", "running"})


def node_states(client) -> dict[str, str]:
    """node id -> Status.State ("ready", "down", ...) from the manager."""
    return {n["ID"]: (n.get("Status") or {}).get("State", "unknown") for n in client.nodes()}


def task_labels(task: dict) -> dict:
    return (((task.get("Spec") or {}).get("ContainerSpec") or {}).get("Labels")) or {}


def task_holds(task: dict, states: dict[str, str]) -> bool:
    """Whether the task's container may still run (see the module docstring)."""
    if (task.get("Status") or {}).get("State") not in LIVE_TASK_STATES:
        return False
    node = task.get("NodeID")
    return not node or states.get(node) != "down"


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
