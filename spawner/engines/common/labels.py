"""Docker labels on every container and volume the spawner makes.

The spawner writes them and the reconciler reads them, so they live here,
imported by both (no import circle).  `pool_identity` names the ledger that
lent a container its GPUs: a reconciler judges only its own ledger's.
"""

from __future__ import annotations

import hashlib

PREFIX = "org.jupyter.gpuhub"
LABEL_USER = f"{PREFIX}.user"
LABEL_SERVER = f"{PREFIX}.server"
LABEL_LEASE = f"{PREFIX}.lease-id"
LABEL_GPUS = f"{PREFIX}.gpus"
LABEL_HOST = f"{PREFIX}.host"
LABEL_CUDA = f"{PREFIX}.cuda-version"
LABEL_HOME_OWNER = f"{PREFIX}.home-owner"
LABEL_POOL = f"{PREFIX}.pool"
# The batch job a container runs (spawner/jobs): its id in the ledger.
LABEL_JOB = f"{PREFIX}.job"
# A digest of what a kept container (remove=False) was made for: its lease,
# image, limits and identity.  A start whose digest differs recreates it.
LABEL_CONFIG = f"{PREFIX}.config"

# Containers that still run (or may again without us): they hold their GPUs.
HOLDING_STATES = frozenset({"running", "paused", "restarting", "removing"})


def pool_identity(pool) -> str:
    """A short, password-free identity of a ledger database (a GPUPool: its `safe_url`)."""
    return hashlib.sha256(pool.safe_url.encode()).hexdigest()[:12]
