"""The Scheduler: fires due schedules in the gpu-pool service, whether or not their user's
server runs.

Every `interval` seconds it reads this host's due schedules from the ledger.  Each one is
claimed (its next time moved on, cron.next_firing: one firing however many slots were
missed) and then submitted as its user, as the jobs API would: the user's groups and
directory identity read from the hub now, the submission checked again (a profile the user
lost, a notebook gone), then the runner's own `submit` (job limits, quotas, the queue,
budgets, bookings).  A firing that makes no job records why on the schedule
(`last_error`); the next slot is tried as usual.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from ..pool import PoolError
from ..pool.ledger.schedule_records import Schedule, ScheduleLedger
from . import cron
from .request import BadJob, check_submission
from .schedules import ScheduleLimits

log = logging.getLogger("gpu-pool-page")
INTERVAL_SECONDS = 5.0
MAX_ERROR = 500
SNAPSHOT_ROWS = 500


def utc_now() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    def __init__(self, runner, hub_user: Callable[[str], Awaitable[dict]],
                 clock: Callable[[], datetime] = utc_now, interval: float = INTERVAL_SECONDS):
        self.runner = runner
        self.ledger = ScheduleLedger(runner.pool)
        self.limits = ScheduleLimits(**runner.settings.schedule_limits)
        self.hub_user = hub_user
        self.clock = clock
        self.interval = interval
        self._task: asyncio.Task | None = None
        # Every schedule as the pool page shows them, refreshed at each look (the page never waits on the ledger).
        self.snapshot: list[dict] = []

    def start(self) -> None:
        self._task = asyncio.create_task(self.forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def forever(self) -> None:
        """At start (a firing missed while the service was down runs now, once), then every interval."""
        while True:
            try:
                await self.tick()
            except PoolError as exc:
                log.warning("Could not read the schedules: %s", exc)
            except Exception:
                log.exception("The scheduler's look at the schedules failed")
            await asyncio.sleep(self.interval)

    async def tick(self) -> list[int]:
        """Fire what is due now; the ids of the schedules fired."""
        now = self.clock()
        fired = []
        for schedule in await self.runner.call(self.ledger.due, self.runner.settings.host, now):
            if schedule.next_at is None:
                continue
            fire, next_at = cron.next_firing(schedule.cron, schedule.next_at, now)
            if not fire or not await self.runner.call(self.ledger.claim, schedule.id, schedule.next_at, next_at):
                continue  # another service fired it, or it was paused or deleted meanwhile
            await self.fire(schedule)
            fired.append(schedule.id)
        self.snapshot = [s.to_dict() for s in await self.runner.call(self.ledger.schedules, None, SNAPSHOT_ROWS)]
        return fired

    async def fire(self, schedule: Schedule) -> None:
        """Submit the schedule's job as its user; record the job, or why there is none."""
        runner = self.runner
        try:
            user = await self.hub_user(schedule.user)
            groups = sorted(user.get("groups") or [])
            sub = check_submission(schedule.body, list(runner.profiles.values()), groups,
                                   runner.settings.max_seconds, 1, runner.limits.max_parameters_bytes)
            job = await runner.submit(schedule.user, groups, user.get("auth_state"), sub, schedule_id=schedule.id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
            why = getattr(exc, "log_message", None) or str(exc) or type(exc).__name__
            if not isinstance(exc, BadJob) and status is None:
                log.exception("Schedule %s of %s could not fire", schedule.id, schedule.user)
            else:
                log.info("Schedule %s of %s made no job: %s", schedule.id, schedule.user, why)
            await runner.call(self.ledger.record_firing, schedule.id, None, why[:MAX_ERROR])
            return
        log.info("Schedule %s of %s fired job %s", schedule.id, schedule.user, job.id)
        await runner.call(self.ledger.record_firing, schedule.id, job.id, None)
