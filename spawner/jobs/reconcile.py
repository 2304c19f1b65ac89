"""Keep job leases and job units (containers, services) in agreement, with the servers' guarantees.

The hub's reconciler leaves job leases alone (no hub server holds them); this
pass, run by the gpu-pool service at start and every `reconcile_interval` (the hub's
`c.Reconciler.interval` when set, else 30 s):

- a job lease whose job has ended, is missing, or holds another lease (and is
  older than `c.Reconciler.min_lease_age`, else `MIN_AGE`): its units are removed, and the lease ends once
  the engine confirms that (reason: the job's end, else `reconciled`);
- a job unit that runs with GPUs but without an active lease: removed;
- a stopped unit of an ended job (a removal that failed before): removed;
- a job's network (a cluster's, or a job's own overlay and its proxy on Swarm) whose job has
  ended or is missing: removed.  A job's runner removes it at the end; this catches those left
  when the gpu-pool service stopped in between, or whose removal failed.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from ..engines.common.labels import LABEL_GPUS, LABEL_JOB, LABEL_LEASE
from ..pool import EndReason, PoolError
from ..pool.ledger.job_records import END_REASONS, is_job_server, job_id_of

log = logging.getLogger("gpu-pool-page")
# A lease this young may belong to a job whose record is being written.
MIN_AGE = 30.0


async def reconcile_jobs(runner, min_age: float = MIN_AGE) -> dict[str, list]:
    """One pass (see the module docstring); what it did."""
    report: dict[str, list] = {"ended": [], "removed": [], "networks": []}
    host = runner.settings.host or None
    # Containers first, then leases (the hub's reconciler's order): a job that starts in
    # between has its lease read but its container unseen, so it is left alone.  The
    # other order would see its container but not its lease, and remove it.
    units = await runner.engine.units(runner.pool_id)
    leases = await runner.call(runner.pool.leases, None, host)
    active = {lease.id for lease in leases}
    cutoff = datetime.now(UTC) - timedelta(seconds=min_age)

    for lease in leases:
        if not is_job_server(lease.server_name) or lease.started_at > cutoff:
            continue
        job_id = job_id_of(lease.server_name)
        job = await runner.call(runner.ledger.get, job_id) if job_id is not None else None
        if job is not None and job.active and (not job.lease_ids or lease.id in job.lease_ids):
            continue  # its job runs (or starts) on it (one of a cluster's worker leases)
        holders = [u for u in units if u.labels.get(LABEL_LEASE) == str(lease.id)]
        removed = [await runner.remove_container(u.id) for u in holders]
        if all(removed):
            reason = END_REASONS.get(job.state, EndReason.RECONCILED) if job is not None else EndReason.RECONCILED
            if await runner.call(runner.pool.release, lease.id, reason):
                report["ended"].append(lease.id)
                log.warning("Ended GPU lease %s of job %s: its job has ended", lease.id, lease.server_name)

    for unit in units:
        labels = unit.labels
        try:
            lease_id = int(labels.get(LABEL_LEASE) or -1)
        except ValueError:
            lease_id = -1
        holding = unit.holding
        if holding and labels.get(LABEL_GPUS) and lease_id not in active:
            why = "it holds GPUs without an active lease"
        elif not holding:
            job = await runner.call(runner.ledger.get, int(labels[LABEL_JOB]))
            if job is not None and job.active:
                continue  # its runner reads its exit and log first
            why = "its job has ended"
        else:
            continue
        if await runner.remove_container(unit.id):
            report["removed"].append(unit.name)
            log.warning("Removed job container %s: %s", report["removed"][-1], why)

    # Networks last: Docker refuses to remove one that a unit removed above still joined.  Listed
    # after the ledger's jobs would not do: a job made between the two reads has its network
    # seen and its record unseen.  So each network's job is read after the list.
    for name, job_label in (await runner.engine.networks(runner.pool_id)).items():
        job = await runner.call(runner.ledger.get, int(job_label)) if job_label.isdigit() else None
        if job is not None and job.active:
            continue
        if await runner.engine.remove_network(name):
            report["networks"].append(name)
            log.warning("Removed job network %s: its job %s", name,
                        "has ended" if job is not None else "is not in the ledger")
    return report


async def reconcile_forever(runner) -> None:
    while True:
        try:
            await reconcile_jobs(runner, runner.settings.reconcile_min_age)
        except PoolError as exc:
            log.error("Job reconcile skipped: %s", exc)
        except Exception:
            log.exception("Job reconcile failed; will retry")
        await asyncio.sleep(runner.settings.reconcile_interval)
