"""Which running jobs the pool's fair use stops, and why: the check a jobs runner asks each round.

A running job whose lease runs into a booking of its GPU for someone else, or past its
holder's GPU-hour budget, is to stop like a cancel, with the reason in its message and in its
leases' end (`booking`, `budget`): the same rules the culler applies to servers (the culler's
checks read the same words, culling/policy.py).  A ledger that cannot say stops nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from ..ledger.job_records import RUNNING, Job
from ..models import EndReason


@dataclass(frozen=True)
class FairUseStop:
    """A job to stop: its message, its leases' end reason."""

    job_id: int
    message: str
    reason: EndReason


def booked_out(pool, lease_id: int, log: logging.Logger | None = None) -> str | None:
    """Why the lease must end for a booking of its GPU for someone else that has begun, else None
    (also when the ledger cannot be read)."""
    try:
        found = pool.lease_booked_out(lease_id)
    except Exception as exc:
        if log is not None:
            log.warning("Cannot check the bookings of lease %s: %s", lease_id, exc)
        return None
    if found is None:
        return None
    return f"its GPU is booked by someone else from {found.starts_at.strftime('%H:%M')} UTC (booking {found.id})"


def over_budget(pool, lease_id: int, log: logging.Logger | None = None) -> str | None:
    """Why the lease's holder is past a GPU-hour budget, else None (also when the ledger cannot
    be read: never stop on a ledger that cannot say)."""
    try:
        found = pool.lease_over_budget(lease_id)
    except Exception as exc:
        if log is not None:
            log.warning("Cannot check the GPU-hour budget of lease %s: %s", lease_id, exc)
        return None
    return None if found is None else found.message(pool.budgets().period_s)


def fair_use_stops(pool, jobs: Iterable[Job], log: logging.Logger | None = None) -> list[FairUseStop]:
    """Of `jobs` (a runner's), each running one that a booking or a budget stops, and why.
    Blocking: call it off the event loop."""
    stops = []
    for job in jobs:
        if job.state != RUNNING:
            continue
        for lease_id in job.lease_ids:
            if why := booked_out(pool, lease_id, log):
                stops.append(FairUseStop(job.id, f"stopped: {why}", EndReason.BOOKING))
            elif why := over_budget(pool, lease_id, log):
                stops.append(FairUseStop(job.id, f"stopped: its GPU-hour budget is used up ({why})", EndReason.BUDGET))
            else:
                continue
            break
    return stops
