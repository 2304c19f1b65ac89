"""Keep the ledger and Docker in agreement.

Runs inside the hub once it has started (after JupyterHub has loaded and
polled every server it knew) and then every `interval` seconds:

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

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable

from traitlets import Bool, Float
from traitlets.config import LoggingConfigurable

from .labels import HOLDING_STATES, LABEL_GPUS, LABEL_HOST, LABEL_LEASE, LABEL_POOL, pool_identity
from .metrics import RECONCILE_PASSES
from .pool import EndReason, GPUPool, PoolError
from .pool.jobs import is_job_server


@dataclass
class ReconcileReport:
    kept: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    containers_stopped: list[str] = field(default_factory=list)


# When this process (the hub) started: leases older than that cannot belong
# to a spawn of this process that has not yet recorded its lease.
PROCESS_STARTED = datetime.now(timezone.utc)


def reconcile(pool: GPUPool, docker_client, host: str, tracked_lease_ids: Iterable[int],
              log=None, min_age: float = 30.0, process_started: datetime | None = None) -> ReconcileReport:
    """One pass over the ledger and Docker on `host` (see the module docstring).

    A lease granted to this process less than `min_age` seconds ago is left
    alone: its spawn may not have recorded it on the spawner yet.  Leases
    from before `process_started` (a previous hub's) are judged at once.
    """
    report = ReconcileReport()
    tracked = set(tracked_lease_ids)
    cutoff = max(datetime.now(timezone.utc) - timedelta(seconds=min_age), process_started or PROCESS_STARTED)
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
        if lease_id in tracked or lease.started_at > cutoff or is_job_server(lease.server_name):
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


class Reconciler(LoggingConfigurable):
    """Runs `reconcile` in the hub at start and periodically."""

    enabled = Bool(True, config=True, help="Reconcile the GPU ledger with Docker at hub start and periodically.")
    interval = Float(
        300.0,
        config=True,
        help="Seconds between reconcile passes after the one at hub start.",
    )
    min_lease_age = Float(
        30.0,
        config=True,
        help="Leases younger than this many seconds are never ended by a reconcile pass: a spawn "
        "that was just granted one may not have recorded it yet.",
    )

    def __init__(self, pool_factory: Callable[[], GPUPool], docker_factory: Callable, host: str,
                 tracked_lease_ids: Callable[[], set[int]], pass_fn: Callable | None = None, **kwargs):
        super().__init__(**kwargs)
        self._pool_factory = pool_factory
        self._docker_factory = docker_factory
        self._host = host
        self._tracked = tracked_lease_ids
        # One pass: `reconcile` (containers of one host) or an engine's own (Swarm: every node).
        self._pass = pass_fn or reconcile

    async def run_once(self) -> ReconcileReport | None:
        try:
            pool = self._pool_factory()
            client = self._docker_factory()
            report = await asyncio.to_thread(self._pass, pool, client, self._host, self._tracked(), self.log,
                                             self.min_lease_age)
            self.log.debug("GPU reconcile pass: kept leases %s, ended %s, removed containers %s",
                           report.kept, report.ended, report.containers_stopped)
            RECONCILE_PASSES.labels("ok").inc()
            return report
        except PoolError as exc:
            self.log.error("GPU ledger reconcile skipped: %s", exc)
        except Exception:
            self.log.exception("GPU ledger reconcile failed; will retry")
        RECONCILE_PASSES.labels("failed").inc()
        return None

    async def run_forever(self, first_delay: float = 0.0) -> None:
        await asyncio.sleep(first_delay)
        while self.enabled:
            await self.run_once()
            await asyncio.sleep(self.interval)


_hub_task: asyncio.Task | None = None


def start_in_hub(config=None) -> None:
    """Schedule the reconciler in the running hub process (idempotent).

    Called from jupyterhub_config.py (so it runs even when no server exists)
    and by the first GPUDockerSpawner.  The first pass waits until the hub has
    started, i.e. after JupyterHub has loaded and polled every known server.
    """
    global _hub_task
    if _hub_task is not None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # not inside the hub (a script, a unit test)
    from jupyterhub.app import JupyterHub

    if not JupyterHub.initialized():
        return
    app = JupyterHub.instance()
    from .lending.admission import take_over_spawn_limit
    from .lending.spawner import shared_pool

    def tracked() -> set[int]:
        ids = set()
        for user in list(app.users.values()):
            for spawner in list(user.spawners.values()):
                if hasattr(spawner, "leases_in_hand"):
                    ids |= spawner.leases_in_hand()
        return ids

    def docker_client():
        import docker

        return docker.from_env()

    def pool():
        return shared_pool(app.config)

    async def run():
        await app._start_future
        take_over_spawn_limit(app)
        # An engine whose objects are not this host's containers brings its own pass.
        pass_fn = getattr(app.spawner_class, "reconcile_pass", None)
        reconciler = Reconciler(pool, docker_client, pool().inventory.host, tracked, pass_fn,
                                config=app.config, log=app.log)
        if reconciler.enabled:
            await reconciler.run_forever()

    _hub_task = loop.create_task(run())
