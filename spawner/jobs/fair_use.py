"""Running jobs meet the pool's fair-use rules as servers do (the culler stops those).

Every FAIR_USE_EVERY seconds the runner looks at each running job of its host: a lease that
runs into a booking of its GPU for someone else, or past its holder's GPU-hour budget, stops
the job like a cancel, with the reason in the job's message and in its leases' end
(`booking`, `budget`).  The checks are the culler's own (culling/policy.py); a ledger that
cannot say stops nothing.
"""

from __future__ import annotations

import asyncio
import logging

from ..culling.policy import LedgerBookings, LedgerBudgets
from ..pool import PoolError
from ..pool.ledger.job_records import CANCELLED, END_REASONS, RUNNING, Job
from ..pool.models import EndReason

log = logging.getLogger("gpu-pool-page")
# How often running jobs' leases are checked (a culler round).
FAIR_USE_EVERY = 30.0
OWNER_CANCEL = "cancelled while running"


class FairUseStops:
    """The jobs this runner stopped for fair use: job id -> (message, the leases' end reason)."""

    def __init__(self, runner):
        self.runner = runner
        self._why: dict[int, tuple[str, EndReason]] = {}

    async def forever(self, every: float = FAIR_USE_EVERY) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.round()
            except PoolError as exc:  # the next round tries again; nothing is stopped unchecked
                log.warning("Could not check the running jobs' budgets and bookings: %s", exc)

    async def round(self) -> list[int]:
        """Mark for stopping each running job of this host whose lease runs into a booking for
        someone else or past its holder's budget; the ids of the jobs marked."""
        runner = self.runner
        booked_out, over_budget = LedgerBookings(runner.pool, log), LedgerBudgets(runner.pool, log)
        stopped = []
        for job in await runner.call(runner.ledger.jobs, None, True, 10000):
            if job.state != RUNNING or job.host != runner.settings.host or job.id in runner._cancel:
                continue
            for lease_id in job.lease_ids:
                if why := await runner.call(booked_out, lease_id):
                    self._why[job.id] = (f"stopped: {why}", EndReason.BOOKING)
                elif why := await runner.call(over_budget, lease_id):
                    self._why[job.id] = (f"stopped: its GPU-hour budget is used up ({why})", EndReason.BUDGET)
                else:
                    continue
                runner._cancel.add(job.id)  # the job's own watch stops it at its next turn
                stopped.append(job.id)
                break
        return stopped

    def message(self, job: Job) -> str:
        """Why a job stopped while running: this round's word, or its owner's cancel."""
        return self._why.get(job.id, (OWNER_CANCEL, None))[0]

    def end_reason(self, job: Job, state: str) -> EndReason:
        """What the job's leases end with: the state's, or `booking` / `budget` when those stopped it."""
        found = self._why.get(job.id)
        return found[1] if found is not None and state == CANCELLED else END_REASONS[state]

    def forget(self, job: Job) -> None:
        """Once a stopped job's end is recorded."""
        self._why.pop(job.id, None)
