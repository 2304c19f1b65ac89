"""The Docker engine's reconcile pass: the containers of one host against the ledger.

- a lease held by a server the hub tracks, whose container runs: kept (adopted);
- an active lease on this host that no tracked server holds: its container,
  if any, is stopped and removed, and the lease ends with reason `reconciled`
  (a hub killed mid-spawn, a server lost from the hub's database, a stop
  that failed) -- but only once the removal succeeded: while Docker cannot
  remove it, the GPU stays lent and the next pass tries again;
- a running container that carries GPUs without an active lease: stopped and
  removed, so no one uses a GPU the ledger thinks is free.

Batch jobs' leases (server name `job/<id>`) belong to no hub server: the jobs'
own reconciler (spawner/jobs/reconcile.py, in the gpu-pool service) judges them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from ...pool import EndReason, GPUPool
from ...pool.ledger.job_records import is_job_server
from .labels import HOLDING_STATES, LABEL_GPUS, LABEL_HOST, LABEL_LEASE, LABEL_POOL, pool_identity
from .reconciler import ReconcileReport

# When this process (the hub) started: leases older than that cannot belong
# to a spawn of this process that has not yet recorded its lease.
PROCESS_STARTED = datetime.now(UTC)


def reconcile(pool: GPUPool, docker_client, host: str, tracked_lease_ids: Iterable[int],
              log=None, min_age: float = 30.0, starting: Iterable[tuple[str, str]] = (),
              process_started: datetime | None = None) -> ReconcileReport:
    """One pass over the ledger and Docker on `host` (see the module docstring).

    A lease granted to this process less than `min_age` seconds ago is left
    alone: its spawn may not have recorded it on the spawner yet.  So is a
    lease of a server in `starting` ((user, server name) pairs whose spawn is
    in progress), of any age: the spawn owns it, and records or settles it
    itself.  Leases from before `process_started` (a previous hub's) are
    judged at once.
    """
    report = ReconcileReport()
    tracked = set(tracked_lease_ids)
    in_spawn = set(starting)
    cutoff = max(datetime.now(UTC) - timedelta(seconds=min_age), process_started or PROCESS_STARTED)
    # Only containers lent GPUs by this ledger: other hubs on this Docker host
    # (with their own ledgers) are none of our business.
    # ignore_removed: a container removed while we list them must not abort the pass.
    containers = docker_client.containers.list(
        all=True, ignore_removed=True, filters={"label": [LABEL_LEASE, f"{LABEL_POOL}={pool_identity(pool)}"]})
    by_lease: dict[int, list] = {}
    for container in containers:
        labels = container.labels
        if labels.get(LABEL_HOST, host) != host:
            continue
        try:
            by_lease.setdefault(int(labels.get(LABEL_LEASE) or -1), []).append(container)
        except ValueError:
            by_lease.setdefault(-1, []).append(container)

    active = {lease.id: lease for lease in pool.leases(host=host)}
    for lease_id, lease in active.items():
        if lease_id in tracked or lease.started_at > cutoff or is_job_server(lease.server_name) \
                or (lease.user, lease.server_name or "") in in_spawn:
            report.kept.append(lease_id)
            continue
        removed = [_remove(container, report, log, f"its lease {lease_id} is held by no server the hub tracks")
                   for container in by_lease.get(lease_id, [])]
        if not all(removed):
            continue  # the GPU may still be in use: the lease stays until the removal succeeds
        if pool.release(lease_id, EndReason.RECONCILED):
            report.ended.append(lease_id)
            if log:
                log.warning("Ended GPU lease %s of %s: no server holds it", lease_id, lease.user)

    for lease_id, group in by_lease.items():
        if lease_id in active:
            continue
        for container in group:
            # A paused or created container can run again: it holds its GPUs as a running one does.
            if container.labels.get(LABEL_GPUS) and container.status in HOLDING_STATES | {"created"}:
                _remove(container, report, log, "it holds GPUs without an active lease")
    return report


def _remove(container, report: ReconcileReport, log, why: str) -> bool:
    """Remove the container; True once Docker confirms it is gone."""
    import docker.errors

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return True  # already gone
    except Exception as exc:  # the daemon refused or failed: reported, retried next pass
        if log:
            log.error("Could not remove container %s (%s): %s", container.name, why, exc)
        return False
    report.containers_stopped.append(container.name)
    if log:
        log.warning("Removed container %s: %s", container.name, why)
    return True
