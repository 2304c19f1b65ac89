"""GPU JupyterHub: a DockerSpawner that lends NVIDIA GPUs exclusively.

Folders, in the order data flows (tests/harness/layers.py prints the floors and arrows):
    inventory/     what GPUs a host or Swarm node has (NVML, a static list, simulated, Swarm)
    pool/          the lease ledger: a locked pool in SQL (SQLAlchemy), a few rooms by capability
    profiles       what a user may choose, validation of their choice, the spawn form
    lending/       GPULendingSpawner: what every engine shares (leases and their end, admission)
    jobs/          batch jobs and clusters on leased GPUs, handed the engine that runs their units
    notify/        telling people (e-mail, webhooks, JupyterLab) what happened to their work
    culling/       the GPU-aware idle culler (its pure rule: culling.policy)
    auth/          Active Directory / OpenLDAP login
    services/      what the project's hub services share with the hub (lifecycle, callers, its API)
    engines/       what runs servers and jobs: common/, docker/ (one host), swarm/ (a Swarm),
                   each one record looked up by name (engines.engine)
    poolpage/      the gpu-pool service: the pool page, bookings, jobs, action scripts
    ssh/           the SSH gateway service (and ssh.spawner_access, the spawner's side)
    settings/      GPUHUB_* environment settings for hub_config/jupyterhub_config.py
    cli/           the `gpu-pool` admin command (and `gpu-pool agent`, the per-node GPU agent)
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `gpu-pool` and the pool's tests don't import Docker and JupyterHub.
    if name == "GPUDockerSpawner":
        from .engines.docker.spawner import GPUDockerSpawner

        return GPUDockerSpawner
    raise AttributeError(name)
