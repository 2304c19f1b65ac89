"""The reconciler: keeps the ledger and the engine in agreement.

Runs inside the hub once it has started (after JupyterHub has loaded and
polled every server it knew) and then every `interval` seconds.  One pass is
the engine's own (`reconcile_pass` on the spawner class: spawner/engines/common/reconcile_containers.py
judges one host's containers, spawner/engines/swarm/reconcile.py every node's tasks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from traitlets import Bool, Float
from traitlets.config import LoggingConfigurable

from ...metrics import RECONCILE_PASSES
from ...pool import GPUPool, PoolError


@dataclass
class ReconcileReport:
    kept: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    containers_stopped: list[str] = field(default_factory=list)


class Reconciler(LoggingConfigurable):
    """Runs the engine's reconcile pass in the hub at start and periodically."""

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
                 tracked_lease_ids: Callable[[], set[int]], pass_fn: Callable,
                 starting_servers: Callable[[], set[tuple[str, str]]] = set, **kwargs):
        super().__init__(**kwargs)
        self._pool_factory = pool_factory
        self._docker_factory = docker_factory
        self._host = host
        self._tracked = tracked_lease_ids
        self._starting = starting_servers
        # One pass, the engine's own: the containers of one host, or every node of a Swarm.
        self._pass = pass_fn

    async def run_once(self) -> ReconcileReport | None:
        try:
            pool = self._pool_factory()
            client = self._docker_factory()
            # Read before the ledger is: a spawn that was granted a lease after this
            # snapshot is in `starting` (its lease may not be recorded on the spawner yet).
            report = await asyncio.to_thread(self._pass, pool, client, self._host, self._tracked(), self.log,
                                             self.min_lease_age, self._starting())
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
    from ...lending.admission import take_over_spawn_limit
    from ...lending.spawner import GPULendingSpawner, shared_pool

    def tracked() -> set[int]:
        ids = set()
        for user in list(app.users.values()):
            for spawner in list(user.spawners.values()):
                if isinstance(spawner, GPULendingSpawner):
                    ids |= spawner.leases_in_hand()
        return ids

    def starting() -> set[tuple[str, str]]:
        return {(user.name, spawner.name or "")
                for user in list(app.users.values()) for spawner in list(user.spawners.values())
                if isinstance(spawner, GPULendingSpawner) and spawner.pending == "spawn"}

    def docker_client():
        import docker

        return docker.from_env()

    def pool():
        return shared_pool(app.config)

    async def run():
        await app._start_future
        take_over_spawn_limit(app)
        reconciler = Reconciler(pool, docker_client, pool().inventory.host, tracked, app.spawner_class.reconcile_pass,
                                starting, config=app.config, log=app.log)
        if reconciler.enabled:
            await reconciler.run_forever()

    _hub_task = loop.create_task(run())
