"""The GPU lease ledger: a locked pool that never lends one GPU twice.

A lease lends one or more GPUs of one host to one user's server.  The ledger
lives in SQL (SQLite by default, PostgreSQL for several hubs or hosts) and
keeps every lease after it ends: it is the accounting record.

Exclusivity
    The database enforces it, not Python: a partial unique index over the
    active rows of `gpu_pool_lease_gpus` allows one active lease per
    (host, uuid).  Every change runs in one transaction under the ledger's
    write lock (SQLite: ``BEGIN IMMEDIATE`` with a busy timeout; PostgreSQL:
    a transaction-scoped advisory lock), so N GPUs are granted all at once or
    not at all, and two hub processes, or a hub and the ``gpu-pool`` CLI, can
    never hand out one GPU twice.  Should anything bypass the lock, the
    unique index rejects the second lease and the request is retried.

Fair queue
    A request that cannot be met now may wait (``acquire(timeout=...)``) in a
    queue that lives in the database (``gpu_pool_waiters``), shared by every
    process using the ledger.  The policy is FIFO with bounded backfill:

    - Requests are served in arrival order.  When GPUs free up, the earliest
      waiters that fit are served first.
    - A later request may pass an earlier one that cannot be met yet (say a
      1-GPU request behind a 4-GPU one while 2 GPUs are free), but only while
      the earlier one has waited less than ``GPUPool.backfill_window``
      seconds.  After that, free GPUs on its hosts are held for it until it
      is served or gives up, so a big request cannot starve behind small
      ones.  A big request blocks small ones at most for its own timeout,
      which the spawner bounds by its start timeout.
    - A request that can never be met (more GPUs than any host has, over its
      quota) is refused at once instead of queueing.

    A waiter writes to the ledger only to join the queue, to take its lease
    and to leave.  In between, one watch per process reads the queue for all
    of its waiters (a read, no lock; rows that cannot change anything, such
    as a long queue behind a full host, stay in the database), and a waiter
    tries for its lease only when that read says a grant would serve it.  One
    write every ``heartbeat_interval`` seconds refreshes the heartbeats of
    all the process's waiters; the rows of waiters whose process died are
    ignored after ``waiter_stale_after`` seconds and deleted.  Waiters in the
    process that releases GPUs hear of it within 50 ms (one read per burst of
    releases); waiters in other processes within ``poll_interval`` seconds.
    All of it runs on the ledger's own threads (ledger/off_loop.py), not on the
    event loop's default executor.  A cancelled wait removes its queue row
    and leaves no lease behind.

Placement
    A lease never spans hosts.  Among hosts that fit, the one with the fewest
    free GPUs is chosen (keeping big blocks free for big requests); on a host,
    a multi-GPU lease takes the GPUs closest in the inventory's topology (NVML
    topology levels), and a single-GPU lease takes the most isolated free GPU
    so that close pairs stay free.  Drained GPUs and GPUs missing from the
    inventory are never lent.

Quotas
    ``max_gpus_per_user`` caps the GPUs one user holds across all their named
    servers; ``group_gpu_limits`` gives members of a JupyterHub group their
    own cap (a user gets the largest cap of their groups; None = no cap).
    The user's groups are recorded on each lease, for per-group accounting.

Layout
    Rooms by capability, each with its SQL beside it: ledger/ (store, schema, statements,
    off-loop calls, the jobs' records), leasing/, fair_use/, history/, hosts/; at the top the
    GPUPool facade (gpupool.py), models.py and validation.py.  The module map
    (docs/how-it-works/modules.md, generated) lists every module.
"""

import logging

from .gpupool import LEDGER_FILE, GPUPool
from .hosts.readings import Reading
from .ledger.schema import (
    NAME_MAX,
    SCHEMA_VERSION,
    UTCDateTime,
    audit_table,
    gpus_table,
    jobs_table,
    lease_gpus_table,
    leases_table,
    meta_table,
    metadata,
    readings_table,
    waiters_table,
)
from .ledger.store import INTEGRITY_RETRIES, PG_LOCK_KEY
from .models import (
    EndReason,
    GPUStatus,
    HostConflict,
    InvalidRequest,
    Lease,
    PoolError,
    PoolUnavailable,
    QuotaExceeded,
    UnknownGPU,
    Unsatisfiable,
    Waiter,
    WaitTimeout,
    ordinal,
)

# The environment variables that name the ledger, for the hub's settings and for the processes
# beside it (`gpu-pool`, its agent, the idle culler, the pool service): its URL, or a file holding
# it (a Docker secret).  The older names still work, with a deprecation warning.
ENV_DB_URL = "GPUHUB_POOL_DB_URL"
ENV_DB_URL_FILE = "GPUHUB_POOL_DB_URL_FILE"
DEPRECATED_ENV = {"GPU_POOL_DB_URL": ENV_DB_URL, "GPU_POOL_DB_URL_FILE": ENV_DB_URL_FILE}


def ledger_env(name: str, env=None) -> str:
    """`env[name]` (stripped), else its deprecated older name's value with a warning, else ""."""
    import os
    import warnings

    env = os.environ if env is None else env
    value = env.get(name, "").strip()
    if value:
        return value
    for old, new in DEPRECATED_ENV.items():
        if new == name and env.get(old, "").strip():
            warnings.warn(f"{old} is deprecated: set {new} instead", DeprecationWarning, stacklevel=2)
            logging.getLogger("gpu-pool").warning("%s is deprecated: set %s instead", old, new)
            return env[old].strip()
    return ""


__all__ = [
    "ENV_DB_URL",
    "ENV_DB_URL_FILE",
    "ledger_env",
    "GPUPool",
    "LEDGER_FILE",
    "EndReason",
    "GPUStatus",
    "HostConflict",
    "InvalidRequest",
    "Lease",
    "PoolError",
    "PoolUnavailable",
    "QuotaExceeded",
    "UnknownGPU",
    "Unsatisfiable",
    "Waiter",
    "WaitTimeout",
    "ordinal",
    "NAME_MAX",
    "SCHEMA_VERSION",
    "UTCDateTime",
    "audit_table",
    "gpus_table",
    "jobs_table",
    "lease_gpus_table",
    "leases_table",
    "meta_table",
    "metadata",
    "readings_table",
    "Reading",
    "waiters_table",
    "INTEGRITY_RETRIES",
    "PG_LOCK_KEY",
]
