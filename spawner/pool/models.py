"""The ledger's values and errors: leases, GPU states, queue entries, end reasons.

Pure data with no database and no I/O, so the spawner, the CLI and the tests
can use them freely; every other module of the pool speaks in these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from ..inventory.machine import GPU

# --- errors ---------------------------------------------------------------


class PoolError(Exception):
    """Base of the pool's errors.  str(exc) is a message fit to show a user."""

    status_code = 500


class InvalidRequest(PoolError):
    """Bad input: a count that is not a positive integer, a bad name or reason."""

    status_code = 400


class Unsatisfiable(PoolError):
    """More GPUs asked for than any host has: waiting cannot help."""

    status_code = 400


class QuotaExceeded(PoolError):
    """The request would take the user over their GPU limit."""

    status_code = 403


class UnknownGPU(PoolError):
    """No GPU with that uuid in the ledger."""

    status_code = 404


class PoolUnavailable(PoolError):
    """The ledger's database is unreachable, or stayed locked too long.

    `transient` is True when trying again later may succeed (a lock held by
    another process, a lost or unanswered connection); False when only an
    operator can fix it (a newer schema, a host identity conflict).
    """

    status_code = 503

    def __init__(self, message: str, transient: bool = True):
        super().__init__(message)
        self.transient = transient


class HostConflict(PoolUnavailable):
    """The ledger holds this host's GPUs under another host name (a renamed host)."""

    def __init__(self, message: str):
        super().__init__(message, transient=False)


class WaitTimeout(PoolError):
    """No GPUs came free within the wait's timeout."""

    # A busy pool is an answer, not a failure: JupyterHub counts 5xx spawn
    # errors toward consecutive_failure_limit (and exits), never 4xx.
    status_code = 429

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


# --- values ---------------------------------------------------------------


class EndReason(str, Enum):
    """Why a lease ended; kept in the ledger for accounting."""

    STOPPED = "stopped"
    CULLED = "culled"
    FAILED_START = "failed-start"
    DIED = "died"
    RECONCILED = "reconciled"
    ADMIN = "admin"
    # Batch jobs (spawner/jobs): told apart from notebook servers in history and usage.
    JOB_FINISHED = "job-finished"
    JOB_FAILED = "job-failed"
    JOB_CANCELLED = "job-cancelled"
    JOB_TIMEOUT = "job-timeout"
    # `gpu-pool doctor`'s one-GPU probe: a lease of seconds, never a user's.
    DOCTOR = "doctor"
    # Ended by the culler because its user (or group) ran out of GPU-hour budget (budget.py).
    BUDGET = "budget"
    # Ended at the start of a booking of its GPUs (bookings.py).
    BOOKING = "booking"
    # A borrowed lease (beyond its user's share) given back, after its notice, to a request
    # within its share (leasing/reclaim.py).
    RECLAIMED = "reclaimed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Lease:
    """GPUs of one host lent to one user's server."""

    id: int
    user: str
    server_name: str
    host: str
    gpu_uuids: tuple[str, ...]
    groups: tuple[str, ...]
    started_at: datetime
    ended_at: datetime | None = None
    end_reason: str | None = None
    problem: str | None = None
    """Set while the lease's server has ended but its container would not stop."""
    notice: str | None = None
    """Told at grant: one of its GPUs is booked by someone else later (bookings.notice)."""
    borrowed: bool = False
    """Lent beyond its user's share: reclaimed with notice when a request within its share waits."""
    reclaim_at: datetime | None = None
    """When a waiting request asked for it back (borrowed leases only); it ends within the grace."""

    @property
    def active(self) -> bool:
        return self.ended_at is None

    def gpu_hours(self, since: datetime | None = None, until: datetime | None = None) -> float:
        """GPU-hours of this lease inside [since, until) (an active lease counts up to now)."""
        end = self.ended_at or datetime.now(UTC)
        if until is not None:
            end = min(end, until)
        start = self.started_at if since is None else max(self.started_at, since)
        seconds = (end - start).total_seconds()
        return max(seconds, 0.0) * len(self.gpu_uuids) / 3600.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "server_name": self.server_name,
            "host": self.host,
            "gpu_uuids": list(self.gpu_uuids),
            "groups": list(self.groups),
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "end_reason": self.end_reason,
            "problem": self.problem,
            "borrowed": self.borrowed,
            "reclaim_at": iso(self.reclaim_at),
        }


@dataclass(frozen=True)
class GPUStatus:
    """A GPU as the ledger sees it: drained or not, and who holds it."""

    gpu: GPU
    drained: bool
    lease: Lease | None
    present: bool = True
    """False when the GPU is gone from its host's inventory (lost, removed)."""
    drained_at: datetime | None = None

    @property
    def state(self) -> str:
        """'lent' (drained or not), 'drained', 'missing' or 'free'."""
        if self.lease is not None:
            return "lent"
        if self.drained:
            return "drained"
        if not self.present:
            return "missing"
        return "free"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.gpu.host,
            "index": self.gpu.index,
            "uuid": self.gpu.uuid,
            "name": self.gpu.name,
            "memory_mib": self.gpu.memory_mib,
            "parent_uuid": self.gpu.parent_uuid,
            "state": self.state,
            "drained": self.drained,
            "drained_at": iso(self.drained_at),
            "present": self.present,
            "lease": self.lease.to_dict() if self.lease else None,
        }


@dataclass(frozen=True)
class Waiter:
    """A request waiting in the queue."""

    id: int
    user: str
    server_name: str
    count: int
    since: datetime
    position: int
    groups: tuple[str, ...] = ()
    hosts: tuple[str, ...] | None = None
    workers: int = 1  # a gang (a cluster job): `workers` leases of `count` GPUs each
    why: str = ""
    """Why it is where it is in the queue (fairshare.why: names nobody, tells its own use)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "why": self.why,
            "user": self.user,
            "server_name": self.server_name,
            "count": self.count,
            "workers": self.workers,
            "since": iso(self.since),
            "groups": list(self.groups),
            "hosts": list(self.hosts) if self.hosts is not None else None,
        }


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def ordinal(n: int) -> str:
    """1 -> '1st', 2 -> '2nd', 11 -> '11th'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def gpus_text(n: int) -> str:
    """1 -> '1 GPU', 2 -> '2 GPUs'."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"
