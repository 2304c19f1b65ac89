"""Running places: the jobs that hold room within their users' job limits (limits.py).

A job takes a place before it may take GPUs and keeps it until it ends (or, reclaimed, goes
back to the queue); a job that waits for one says why in its record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..pool.ledger.job_records import Job
from ..profiles import Profile
from .limits import JobLimits


class RunningPlaces:
    """job id -> (user, profile slug, CPUs) of each job holding a running place."""

    def __init__(self, limits: JobLimits, profiles: dict[str, Profile]):
        self.limits = limits
        self.profiles = profiles
        self.held: dict[int, tuple[str, str, float]] = {}
        self._room = asyncio.Event()  # set when a place is given back

    def of_user(self, user: str) -> list[tuple[str, float]]:
        """(profile slug, CPUs) of each place the user's jobs hold."""
        return [(slug, cpus) for holder, slug, cpus in self.held.values() if holder == user]

    def hold(self, job: Job) -> None:
        profile = self.profiles.get(job.profile)
        cpus = self.limits.job_cpus(profile, workers=job.workers) if profile is not None else 0.0
        self.held[job.id] = (job.user, job.profile, cpus)

    def leave(self, job_id: int) -> None:
        if self.held.pop(job_id, None) is not None:
            self._room.set()
            self._room = asyncio.Event()

    async def wait_for(self, job: Job, profile: Profile, say: Callable[[str | None], Awaitable[object]]) -> None:
        """Until the user's limits leave room for the job, then hold it; `say(why)` records why it
        waits (None: it no longer does)."""
        said = None
        while True:
            why = self.limits.wait_reason(profile, self.of_user(job.user), workers=job.workers)
            if why is None:
                self.hold(job)
                if said is not None:
                    await say(None)
                return
            if why != said:
                await say(why)
                said = why
                continue  # the ledger call let others run: look again
            await self._room.wait()
