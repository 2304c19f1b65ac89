"""GPU JupyterHub: a DockerSpawner that lends NVIDIA GPUs exclusively.

Folders, in the order data flows:
    inventory/     what GPUs a host or Swarm node has (NVML, a static list, simulated, Swarm)
    pool/          the lease ledger: a locked pool in SQL (SQLAlchemy)
    profiles       what a user may choose, validation of their choice, the spawn form
    ledger_io      ledger calls from the hub's event loop, off the loop and bounded
    lending/       GPULendingSpawner: what every engine shares (leases and their end, admission)
    docker/        the Docker engine: GPUDockerSpawner and its reconcile pass
    swarm/         the Swarm engine: GPUSwarmSpawner, its tasks and reconcile pass
    homes, labels, containers, identity, readiness   what every engine's containers share
    reconciler     the ledger <-> engine agreement loop, at hub start and periodically
    auth/          Active Directory / OpenLDAP login
    culling/       the GPU-aware idle culler (its pure rule: culling.policy)
    jobs/          batch jobs on leased GPUs; poolpage/ the pool page service that runs them
    settings/      GPUHUB_* environment settings for hub_config/jupyterhub_config.py
    cli/           the `gpu-pool` admin command
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `gpu-pool` and the pool's tests don't import Docker and JupyterHub.
    if name == "GPUDockerSpawner":
        from .docker.spawner import GPUDockerSpawner

        return GPUDockerSpawner
    raise AttributeError(name)
