"""Running jobs on borrowed GPUs give them back when a request within its share needs them.

The pool marks borrowed leases for reclaiming (pool/leasing/reclaim.py: `reclaim_at`, written
by the waiting request's own grant transaction, in whatever process it waits).  Every
RECLAIM_POLL seconds the runner reads the marks; a job of this host that holds a marked lease
is told at its next watch turn (its units get SIGTERM through the engine: save a checkpoint
and exit), and once its units have ended or `GPUPool.reclaim_grace` has passed since the mark
it is stopped like any job.  Its leases end `reclaimed` only once the engine confirms every
unit stopped (the lease contract); then the job goes back to the queue by itself (its
`requeue`, on by default), keeping its place by its first submission time, its attempt
count one higher; or, submitted with `requeue: false`, it ends cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from ..pool import PoolError
from ..pool.leasing.reclaim import notice_text
from ..pool.ledger.job_records import CANCELLED, QUEUED, RUNNING, STARTING, Job, job_id_of
from ..pool.models import EndReason

log = logging.getLogger("gpu-pool-page")
# How often the runner reads the reclaim marks (one indexed read of the active borrowed leases).
RECLAIM_POLL = 1.0


class Reclaims:
    """The jobs of this runner whose borrowed leases were asked back: job id -> when (the mark)."""

    def __init__(self, runner):
        self.runner = runner
        self.asked: dict[int, datetime] = {}
        self._told: set[int] = set()
        # The log read at each turn after the notice, where the engine's stop may take the log
        # with it (Swarm removes a scaled-down task's container once it ends): job id -> log.
        self._kept: dict[int, str] = {}

    @property
    def grace(self) -> float:
        return float(self.runner.pool.reclaim_grace)

    async def forever(self, every: float = RECLAIM_POLL) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.round()
            except PoolError as exc:  # the next round reads again; nothing is stopped unread
                log.warning("Could not read the borrowed leases asked back: %s", exc)

    async def round(self) -> list[int]:
        """Note each job of this runner holding a lease asked back; the ids newly noted."""
        runner = self.runner
        noted = []
        for lease in await runner.call(runner.pool.reclaiming, None):
            job_id = job_id_of(lease.server_name)
            if job_id is None or job_id in self.asked or not runner.watches(job_id):
                continue  # a server's (not this slice's), or not a job this runner watches
            self.asked[job_id] = lease.reclaim_at or datetime.now(UTC)
            noted.append(job_id)
            log.info("Job %s's borrowed lease %d is asked back; it gets %g s' notice", job_id, lease.id,
                     self.grace)
        return noted

    def deadline(self, job: Job) -> datetime | None:
        asked = self.asked.get(job.id)
        return asked + timedelta(seconds=self.grace) if asked is not None else None

    async def turn(self, job: Job, units: list[str], ended: bool) -> bool:
        """One watch turn of a job: tell it (SIGTERM, once) when its lease is asked back; True
        when it is to be stopped now (its units ended after the notice, or the grace is over)."""
        deadline = self.deadline(job)
        if deadline is None:
            return False
        if job.id not in self._told:
            self._told.add(job.id)
            told = [await self.runner.engine.signal(name, "SIGTERM") for name in units]
            log.info("Job %s of %s told to give its borrowed GPUs back (SIGTERM to %d of %d unit(s)); "
                     "stopped by %s", job.id, job.user, sum(told), len(units), deadline.strftime("%H:%M:%S UTC"))
            return False  # its units' end after the notice is seen at the next turn
        if self.runner.engine.log_settle_seconds > 0:
            await self._keep_log(job)
        return ended or datetime.now(UTC) >= deadline

    async def _keep_log(self, job: Job) -> None:
        output = await self.runner.read_log(job)
        if output and len(output) >= len(self._kept.get(job.id, "")):
            self._kept[job.id] = output

    async def end(self, job: Job) -> Job | None:
        """Stop the job's units, end its leases `reclaimed` once they are confirmed gone, and queue
        it again (or end it cancelled, `requeue` off); the job as recorded, None if it ended."""
        runner = self.runner
        group = runner.group(job)
        output = await runner.read_log(job)
        earlier = self._kept.get(job.id)
        if earlier and len(earlier) > len(output or ""):
            output = earlier
        stopped = all(await group.stop())
        after = await runner.read_log(job)
        if after is not None and len(after) >= len(output or ""):
            output = after
        if not stopped:  # the job reconciler removes it and ends the leases later
            for lease_id in job.lease_ids:
                await runner.call(runner.pool.set_problem, lease_id,
                                  f"job {job.id}'s container would not stop after its reclaim; retried by the "
                                  "job reconciler")
            await runner.call(runner.ledger.update, job.id, (STARTING, RUNNING), "ended_at", state=CANCELLED,
                              message="stopped: its borrowed GPUs were reclaimed, but its container would not stop",
                              **({"log": output} if output is not None else {}))
            self.forget(job)
            return None
        await group.remove()
        await runner.call(runner.pool.release_all, list(job.lease_ids), EndReason.RECLAIMED)
        self.forget(job)  # (after the end: a round before it would note the lease again)
        kept = {"log": output} if output is not None else {}
        if not job.requeue:
            await runner.call(runner.ledger.update, job.id, (STARTING, RUNNING), "ended_at", state=CANCELLED,
                              message="stopped: its borrowed GPUs were reclaimed for a request within its share "
                                      "(not queued again: requeue is off)", **kept)
            log.info("Job %s of %s reclaimed; not queued again", job.id, job.user)
            return None
        attempt = job.attempts + 1
        again = await runner.call(
            runner.ledger.update, job.id, (STARTING, RUNNING), state=QUEUED, lease_id=None, container=None,
            gpu_uuids=[], units=[], started_at=None, exit_code=None, attempts=attempt,
            message=f"reclaimed: its borrowed GPUs went to a request within its share; queued again "
                    f"(attempt {attempt}), in its place by its first submission", **kept)
        log.info("Job %s of %s reclaimed; queued again (attempt %d)", job.id, job.user, attempt)
        return again

    def forget(self, job: Job) -> None:
        self.asked.pop(job.id, None)
        self._told.discard(job.id)
        self._kept.pop(job.id, None)


async def borrowed_notice(runner, job: Job) -> dict | None:
    """What the job's status says of its borrowed GPUs: {"borrowed", "reclaim_at", "notice"}, or
    None when it runs on none."""
    if job.state not in (STARTING, RUNNING) or not job.lease_ids:
        return None
    lease = await runner.call(runner.pool.lease, job.lease_ids[0])
    if lease is None or not lease.borrowed or not lease.active:
        return None
    grace = float(runner.pool.reclaim_grace)
    if lease.reclaim_at is not None:
        by = lease.reclaim_at + timedelta(seconds=grace)
        notice = (f"running on borrowed GPUs: they are being reclaimed for a request within its share; "
                  f"the job got SIGTERM and is stopped by {by.strftime('%H:%M:%S')} UTC"
                  + (" and queued again" if job.requeue else ""))
    else:
        notice = f"running on borrowed GPUs: may be reclaimed with {notice_text(grace)} notice"
    return {"borrowed": True, "reclaim_at": lease.reclaim_at.isoformat() if lease.reclaim_at else None,
            "notice": notice}
