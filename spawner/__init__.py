"""GPU JupyterHub: a DockerSpawner that lends NVIDIA GPUs exclusively.

Modules, in the order data flows:
    inventory      what GPUs a host has (NVML, a static list, or simulated)
    pool/          the lease ledger: a locked pool in SQL (SQLAlchemy), a package
    profiles       what a user may choose, validation of their choice, the spawn form
    ledger_io      ledger calls from the hub's event loop, off the loop and bounded
    lease_ending   a lease's end: its reason, and release once nothing given it runs
    admission      how many servers one hub starts at once (queued GPU spawns not counted)
    lending        GPULendingSpawner: what every engine shares (leases, state, identity)
    dockerspawner  GPUDockerSpawner: the Docker engine (device requests, lock-down)
    homes, labels  home volumes; the labels the spawner writes and the reconciler reads
    reconcile      ledger <-> Docker agreement at hub start and periodically
    auth/          Active Directory / OpenLDAP login
    culling        GPU-aware cull arbiter for jupyterhub-idle-culler (its rule: cull_policy)
    settings/      GPUHUB_* environment settings for hub_config/jupyterhub_config.py
    cli            the `gpu-pool` admin command
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `gpu-pool` and the pool's tests don't import Docker and JupyterHub.
    if name == "GPUDockerSpawner":
        from .docker.spawner import GPUDockerSpawner

        return GPUDockerSpawner
    raise AttributeError(name)
