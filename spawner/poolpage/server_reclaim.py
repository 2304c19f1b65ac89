"""Servers on borrowed GPUs give them back: stopped like a cull once their notice is over.

A server whose profile may borrow (profiles.py `borrow`) can hold a borrowed lease beyond its
user's share.  When a request within its share cannot be served, that request's own grant
transaction marks the lease (pool/leasing/reclaim.py: `reclaim_at`) and queues a `reclaimed`
notification; from then on JupyterLab's GPU panel (handlers/lab.py) tells the user when the
server stops.  Every RECLAIM_POLL seconds the gpu-pool service reads the marks; a server's
lease (a job's is the jobs runner's, jobs/reclaim.py) whose `GPUPool.reclaim_grace` is over
gets an end intent `reclaimed` in the ledger and a stop through the hub's API, as the culler
does (the culler records `culled`).  The spawner reads the intent when the stop arrives and
ends the lease `reclaimed` only once the engine confirms the container gone (the lease
contract); the waiting request is then served.  A stop the hub did not take (it answered
otherwise, or was away) is asked again RETRY_AFTER seconds later while the mark stands.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from ..pool.ledger.job_records import is_job_server
from ..pool.ledger.off_loop import ledger_call
from ..pool.models import EndReason, PoolError
from ..services.hub_api import HubUnavailable
from ..services.lifecycle import cancel_and_wait

log = logging.getLogger("gpu-pool-page")
# How often the service reads the reclaim marks (one indexed read of the active borrowed leases).
RECLAIM_POLL = 1.0
# Seconds after which a server still holding its reclaimed lease is asked to stop again.
RETRY_AFTER = 30.0
LEDGER_TIMEOUT = 15.0
# Who the end intent names (the pool's audit of who ended what).
ACTOR = "gpu-pool"


class ServerReclaims:
    """The service's task that stops servers whose borrowed leases were asked back, after the grace."""

    def __init__(self, pool, hub, every: float = RECLAIM_POLL):
        self.pool, self.hub, self.every = pool, hub, every
        self.asked: dict[int, datetime] = {}  # lease id -> when its server was last asked to stop
        self._task: asyncio.Task | None = None

    @property
    def grace(self) -> float:
        return float(self.pool.reclaim_grace)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except PoolError as exc:  # the next round reads again; nothing is stopped unread
                log.warning("Could not read the borrowed servers asked back: %s", exc)
            except Exception:
                log.exception("The borrowed servers' reclaim round failed; trying again in %s s", self.every)

    async def round(self, now: datetime | None = None) -> list[int]:
        """Ask the hub to stop each server whose lease's notice is over; the lease ids asked now."""
        now = now or datetime.now(UTC)
        marked = [lease for lease in await ledger_call(self.pool.reclaiming, None, timeout=LEDGER_TIMEOUT)
                  if not is_job_server(lease.server_name)]
        live = {lease.id for lease in marked}
        self.asked = {i: at for i, at in self.asked.items() if i in live}  # ended: forgotten
        asked = []
        for lease in marked:
            due = (lease.reclaim_at or now) + timedelta(seconds=self.grace)
            last = self.asked.get(lease.id)
            if now < due or (last is not None and (now - last).total_seconds() < RETRY_AFTER):
                continue
            if not await ledger_call(self.pool.record_end_intent, lease.id, EndReason.RECLAIMED, ACTOR,
                                     timeout=LEDGER_TIMEOUT):
                continue  # it ended meanwhile
            self.asked[lease.id] = now
            label = f"{lease.user}/{lease.server_name}" if lease.server_name else lease.user
            try:
                await self.hub.stop_server(lease.user, lease.server_name)
            except HubUnavailable as exc:
                log.warning("Could not stop %s's server on reclaimed lease %d (asked again in %g s): %s",
                            label, lease.id, RETRY_AFTER, exc)
                continue
            asked.append(lease.id)
            log.info("Stopping server %s: its borrowed lease %d was asked back at %s and its %g s' notice "
                     "is over", label, lease.id, (lease.reclaim_at or now).isoformat(timespec="seconds"),
                     self.grace)
        return asked


def borrowed_part(lease, grace: float, now: datetime) -> dict | None:
    """What JupyterLab's panel and api/wait say of a borrowed lease: None for one within the share;
    else {"notice", "reclaim_at", "stops_at", "seconds_left"} (the last three None until asked back)."""
    from ..pool.leasing.reclaim import borrowed_notice

    if not getattr(lease, "borrowed", False):
        return None
    if lease.reclaim_at is None:
        return {"notice": borrowed_notice(grace), "reclaim_at": None, "stops_at": None, "seconds_left": None}
    stops = lease.reclaim_at + timedelta(seconds=grace)
    left = max(0, round((stops - now).total_seconds()))
    what = "job" if is_job_server(lease.server_name) else "server"
    return {"notice": f"running on borrowed GPUs: a request within its share needs them; this {what} is "
                      f"stopped at {stops.strftime('%H:%M:%S')} UTC (in {_left(left)}): save your work now",
            "reclaim_at": lease.reclaim_at.isoformat(), "stops_at": stops.isoformat(), "seconds_left": left}


def _left(seconds: int) -> str:
    if seconds >= 120:
        return f"{seconds // 60} min"
    return f"{seconds} s"
