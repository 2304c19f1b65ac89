"""The reconciler's pass over a whole Swarm: every GPU node, services and tasks against the ledger.

`reconcile.reconcile` judges the containers of one host; here each lease
service stands in for a container (its labels are the same lease labels),
and the pass runs once per GPU node the Swarm inventory knows, with the same
guarantees: no lease without a task, no task with GPUs without a lease, only
this ledger's services touched.  Removing a service counts as done only once
Swarm reports none of its tasks still running; until then the lease stays.  Each pass
also removes the relays and own overlays (engines/swarm/relay.py) of servers whose service is
gone: a stop removes them itself, a hub killed mid-stop (or mid-start) leaves them.
"""

from __future__ import annotations

import contextlib
import time

from ..common.labels import LABEL_LEASE, LABEL_POOL, pool_identity
from ..common.reconcile_containers import reconcile
from ..common.reconciler import ReconcileReport
from .relay import sweep
from .tasks import lease_tasks, node_states, task_holds

# How long one pass waits for a removed service's tasks to stop before it
# leaves the lease for the next pass.
REMOVE_WAIT_SECONDS = 15.0
# A relay or server overlay younger than this is never swept: its start may still be making its service.
SWEEP_MIN_AGE = 30.0


class ServiceView:
    """A lease service seen as reconcile() sees a container: labels, name, status, remove()."""

    def __init__(self, client, service: dict, holding: bool, pool_id: str):
        self._client = client
        self.id = service["ID"]
        self.name = service["Spec"]["Name"]
        self.labels = dict(service["Spec"].get("Labels") or {})
        self.status = "running" if holding else "created"
        self._pool_id = pool_id

    def remove(self, force: bool = True) -> None:
        """Remove the service; return once none of its tasks can still run, else raise."""
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self._client.remove_service(self.id)
        deadline = time.monotonic() + REMOVE_WAIT_SECONDS
        while True:
            states = node_states(self._client)
            live = [t for t in lease_tasks(self._client, self._pool_id)
                    if t.get("ServiceID") == self.id and task_holds(t, states)]
            if not live:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(live)} task(s) of {self.name} still run")
            time.sleep(0.5)


class _Services:
    """`client.containers.list(...)` of reconcile(), answered with this ledger's lease services."""

    def __init__(self, client, pool_id: str):
        self._client = client
        self._pool_id = pool_id

    def list(self, all=True, ignore_removed=True, filters=None):
        services = self._client.services(filters={"label": [LABEL_LEASE, f"{LABEL_POOL}={self._pool_id}"]})
        states = node_states(self._client)
        holding = {t.get("ServiceID") for t in lease_tasks(self._client, self._pool_id) if task_holds(t, states)}
        return [ServiceView(self._client, s, s["ID"] in holding, self._pool_id) for s in services]


class _SwarmAsDocker:
    def __init__(self, client, pool_id: str):
        self.containers = _Services(client, pool_id)


def reconcile_swarm(pool, docker_client, tracked_lease_ids, log=None, min_age: float = 30.0,
                    starting=()) -> ReconcileReport:
    """One pass per GPU node of the Swarm (see the module docstring)."""
    inventory = pool.inventory
    inventory.forget_cache()
    pool.sync_inventory()  # nodes that joined, left, went down or were drained
    api = getattr(docker_client, "api", docker_client)
    view = _SwarmAsDocker(api, pool_identity(pool))
    report = ReconcileReport()
    tracked = set(tracked_lease_ids)
    for host in sorted(inventory.hosts()):
        one = reconcile(pool, view, host, tracked, log, min_age, starting)
        report.kept += one.kept
        report.ended += one.ended
        report.containers_stopped += one.containers_stopped
    try:
        sweep(api, pool_identity(pool), log, max(min_age, SWEEP_MIN_AGE))
    except Exception as exc:  # the next pass tries again
        if log:
            log.warning("Could not remove the relays of servers that are gone: %s", exc)
    return report
