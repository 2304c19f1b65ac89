"""GPU JupyterHub: a DockerSpawner that lends NVIDIA GPUs exclusively.

Modules, in the order data flows:
    inventory      what GPUs a host has (NVML, a static list, or simulated)
    pool           the lease ledger: a locked pool in SQL (SQLAlchemy)
    profiles       what a user may choose, and validation of their choice
    dockerspawner  GPUDockerSpawner: leases -> Docker device requests
    reconcile      ledger <-> Docker agreement at hub start and periodically
    auth           Active Directory / OpenLDAP login
    culling        GPU-aware cull arbiter for jupyterhub-idle-culler
    cli            the `gpu-pool` admin command
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `gpu-pool` and the pool's tests don't import Docker and JupyterHub.
    if name == "GPUDockerSpawner":
        from .dockerspawner import GPUDockerSpawner

        return GPUDockerSpawner
    raise AttributeError(name)
