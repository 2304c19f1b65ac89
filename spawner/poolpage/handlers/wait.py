"""Live details for everyone: estimated waits in the queue, GPU utilization and memory in use,
idle-cull deadlines.

Reads the hub (running servers and their last activity, through hubapi), the
ledger (past lease lengths) and the GPUs (utilization as the culler reads
it, and memory in use from the same source); any of them failing only leaves
its part out of the page.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from jupyterhub.utils import url_path_join

from ...culling.deadline import CullRules, contended, deadline
from ...culling.policy import cull_deadline
from ...pool import ENV_DB_URL, ledger_env
from ...pool.ledger.job_records import QUEUED, RUNNING, STARTING, JobLedger, is_job_server, job_id_of
from ...pool.models import PoolError, iso
from ...services.hub_api import HubUnavailable, ServerReads
from .. import estimate, views
from ..server_reclaim import borrowed_part
from ..service_config import PoolPageSettings
from .actions import hub_api
from .base import APIHandler

log = logging.getLogger("gpu-pool-page")
LENGTHS = 500  # past leases an estimate looks at
# Seconds one user's servers, as the hub answered, serve the next callers (cull deadlines move
# with activity, and the page says any activity moves them on).
HUB_READ_MAX_AGE = 5.0


class Settings:
    """What the insight handlers read of the hub's settings (service_config.PoolPageSettings)."""

    def __init__(self, page: PoolPageSettings, db_url: str = ""):
        # The culler's idle limits (0: the hub does not cull), read as the culler reads them.
        self.cull_timeout = page.cull_timeout_gpu
        # The culler's rules (culling/deadline.py): None when the hub does not cull.
        self.cull_rules = CullRules.from_json(page.cull_rules) if page.cull_rules else (
            CullRules(0, self.cull_timeout) if self.cull_timeout > 0 else None)
        self.cull_timeout_cpu = page.cull_timeout_cpu
        self.cull_every = page.cull_every
        self.gpu_idle_percent = page.gpu_idle_percent
        self.gpu_idle_seconds = page.gpu_idle_seconds
        self.idle_after = page.idle_after
        self.inventory = page.inventory
        self.simulated_gpus = page.simulated_gpus
        self.utilization_file = page.utilization_file
        self.db_url = db_url
        self._reader: Callable[[str, str], float | None] | None = None
        self._no_reader: bool | None = None

    def deadline(self, server, contended: bool = False) -> datetime | None:
        """When the culler stops `server` (a hubapi.Server) if it stays idle: the policy's
        rule (culling/policy.py), the culler's own."""
        return cull_deadline(server.last_activity, server.state, self.cull_timeout_cpu, self.cull_timeout,
                             self.cull_rules, contended)

    def utilization_reader(self, pool=None):
        """A callable (host, uuid) -> percent or None, or None where nothing gives it.

        Made once per process (an NVML handle, the Swarm inventory), never per request; on
        Swarm it reads the agents' readings through `pool`, the service's own ledger."""
        if self._reader is None and self._no_reader is None:
            self._reader = self._make_reader(pool)
            self._no_reader = self._reader is None
        return self._reader

    def _make_reader(self, pool):
        from ...culling.policy import CullerUtilization

        if self.inventory == "nvml" or (self.inventory == "simulated" and self.utilization_file):
            return CullerUtilization(self.inventory, self.simulated_gpus, self.utilization_file, log)
        if self.inventory == "swarm" and (pool is not None or self.db_url):
            # Swarm: the per-node agents' readings in the ledger (stale ones read as unknown).
            return CullerUtilization("swarm", 0, "", log, db_url=self.db_url,
                                readings=pool.gpu_readings if pool is not None else None)
        return None


def settings_of(handler) -> Settings:
    if "insight" not in handler.settings:
        page = handler.settings.get("page") or PoolPageSettings()
        handler.settings["insight"] = Settings(page, ledger_env(ENV_DB_URL))
    return handler.settings["insight"]


async def fill_readings(handler, gpus: list[dict]) -> None:
    """Fill the rows' "utilization" and "memory_used_mib" from the pool's readings (as the culler
    reads them; unknown stays None), off the event loop."""
    reader = settings_of(handler).utilization_reader(handler.pool)
    if reader is None or not gpus:
        return
    readings = await asyncio.to_thread(lambda: [reader.reading(g["host"], g["uuid"]) for g in gpus])
    for g, (utilization, memory) in zip(gpus, readings):
        g["utilization"], g["memory_used_mib"] = utilization, memory


async def servers(handler, names) -> list | None:
    """The servers of `names` as the hub has them (ServerReads: per user, kept a few seconds);
    None when the hub does not answer."""
    if "hub_server_reads" not in handler.settings:
        handler.settings["hub_server_reads"] = ServerReads(hub_api(handler), HUB_READ_MAX_AGE)
    try:
        return await handler.settings["hub_server_reads"].of(names)
    except HubUnavailable as exc:
        log.warning("No cull deadlines or wait estimates: %s", exc)
        return None


async def live(handler, gpus: list[dict], queue: list[dict], viewer: views.Viewer) -> dict:
    """Fills gpus' "utilization" and "memory_used_mib" and queue rows' "estimate"/"estimate_s"; returns the viewer's
    servers' cull deadlines {(user, server): datetime} and whether estimates were made.

    The hub is asked for the servers the answer needs, never for every user's: the viewer's
    own (their cull deadlines) and, when someone waits, those of the users holding GPUs (the
    estimate's idle deadlines): at most one user per lease."""
    s = settings_of(handler)
    now = datetime.now(UTC)
    await fill_readings(handler, gpus)
    leases: list = []
    if queue:
        try:
            leases = await handler.ledger(handler.pool.leases)
        except PoolError as exc:
            log.warning("No wait estimates: %s", exc)
            queue = []
    holders = sorted({lease.user for lease in leases if not is_job_server(lease.server_name)})
    running = await servers(handler, [viewer.name, *holders])
    if running is None:
        return {"cull": {}, "why": {}, "estimated": False}
    cull, why = {}, {}
    if s.cull_rules is not None and any(srv.lease_id is not None for srv in running):
        try:
            waiting = [w.hosts for w in await handler.ledger(handler.pool.queue)]
        except PoolError as exc:
            log.warning("Cull deadlines without the queue: %s", exc)
            waiting = []
        for srv in running:
            if srv.lease_id is not None:
                # The culler's own rule (culling/deadline.py): it moves as requests start or stop waiting.
                d = deadline(s.cull_rules, last_activity=srv.last_activity, started=srv.started, is_gpu=True,
                             profile=srv.profile or None, contended=contended(srv.host, waiting))
                if d.at is not None:
                    cull[(srv.user, srv.name)], why[(srv.user, srv.name)] = d.at, d.reason
    if queue:
        try:
            lengths = await handler.ledger(handler.pool.lease_lengths, LENGTHS)
            booked = await handler.ledger(handler.pool.bookings)
            waiters = await handler.ledger(handler.pool.queue)
            jobs = await handler.ledger(JobLedger(handler.pool).jobs, None, True) if any(
                is_job_server(x.server_name) for x in [*leases, *waiters]) else []
        except PoolError as exc:
            log.warning("No wait estimates: %s", exc)
            return {"cull": cull, "why": why, "estimated": False}
        try:
            runs_out = await budget_ends(handler, [lease for lease in leases if not is_job_server(lease.server_name)])
        except PoolError as exc:
            log.warning("Wait estimates without the GPU-hour budgets: %s", exc)
            runs_out = {}
        activity = {(srv.user, srv.name): srv.last_activity for srv in running}
        running_jobs = {j.id: j for j in jobs if j.state in (RUNNING, STARTING)}
        holdings = []
        for lease in leases:
            key = (lease.user, lease.server_name)
            last = activity.get(key)
            idle = last is not None and (now - last).total_seconds() > s.idle_after
            at = cull.get(key)
            aged = at is not None and "maximum age" in why.get(key, "")
            name = f"{lease.user}'s" if viewer.may_see(lease.user) else None
            reason = ""
            if at is not None:
                reason = (f"{name or 'a'} server reaches its maximum age at {at.strftime('%H:%M')} UTC" if aged
                          else f"{name or 'an'} idle server is culled at {at.strftime('%H:%M')} UTC if it stays idle")
            holdings.append(estimate.Holding(lease.started_at, len(lease.gpu_uuids),
                                             at if idle or aged else None, reason,
                                             ends=known_ends(lease, running_jobs, booked, now, name or "a")
                                             + budget_end(runs_out.get((lease.user, tuple(lease.groups))), name),
                                             slots=tuple((lease.host, u) for u in lease.gpu_uuids)))
        free = [(g["host"], g["uuid"]) for g in gpus if g["state"] == "free"]
        # The raw queue read again (the rows hide names): matched by place, as both are in queue order.
        who = [(w.user, tuple(w.groups)) for w in waiters][:len(queue)]
        # A queued job holds its GPUs for its timeout: the grant lends it none booked for someone
        # else before then (pool.acquire's holds_for), and so the estimate.
        queued_jobs = {j.id: j for j in jobs if j.state == QUEUED}
        holds = [queued_jobs[j].holds_for if (j := job_id_of(w.server_name)) in queued_jobs else None
                 for w in waiters][:len(queue)]
        explained = estimate.waits_explained([w["count"] for w in queue], len(free), holdings, now, lengths,
                                             bookings=booked, who=who, free_slots=free, holds=holds)
        for row, (seconds, reason) in zip(queue, explained):
            row["estimate_s"] = None if seconds is None else round(seconds)
            row["estimate"] = estimate.say(seconds)
            row["estimate_why"] = reason if seconds is not None else ""
    return {"cull": cull, "why": why, "estimated": bool(queue)}


def known_ends(lease, running_jobs: dict, booked: list, now: datetime, whose: str) -> tuple:
    """The ends known for a lease at the latest, each with its reason: its job's timeout (a job
    is stopped at its start + its timeout), the start of someone else's booking of its GPU (a
    server is stopped then by the culler, reason `booking`; the culler stops no jobs)."""
    ends = []
    if is_job_server(lease.server_name):
        job = running_jobs.get(job_id_of(lease.server_name))
        if job is not None:
            at = (job.started_at or lease.started_at) + timedelta(seconds=job.timeout_s)
            ends.append((at, f"{whose} job reaches its timeout at {at.strftime('%H:%M')} UTC"))
        return tuple(ends)
    for b in booked:
        # A booking for someone else of one of its GPUs, still to start or started: it ends the lease.
        if b.host == lease.host and set(b.gpu_uuids) & set(lease.gpu_uuids) and b.ends_at > now \
                and not b.for_(lease.user, lease.groups):
            at = max(b.starts_at, now)
            ends.append((at, f"{whose} server is stopped at {at.strftime('%H:%M')} UTC for a booking"))
    return tuple(ends)


async def budget_ends(handler, leases: list) -> dict:
    """{(user, groups): when the first of their GPU-hour budgets runs out at what they hold now}
    for the holders of `leases` (servers: the culler stops a server whose budget runs out,
    reason `budget`); none without budgets."""
    if not handler.pool.budgets().any:
        return {}
    out = {}
    for owner in sorted({(lease.user, tuple(lease.groups)) for lease in leases}):
        ends = [s.runs_out_at for s in await handler.ledger(handler.pool.budget_standings, *owner)
                if s.runs_out_at is not None]
        if ends:
            out[owner] = min(ends)
    return out


def budget_end(at: datetime | None, whose: str | None) -> tuple:
    """The known end of a server whose holder's GPU-hour budget runs out at `at`."""
    if at is None:
        return ()
    return ((at, f"{whose or 'a'} server is stopped at {at.strftime('%H:%M')} UTC, when its GPU-hour budget "
                 "runs out"),)


def cull_text(at: datetime | None, now: datetime, reason: str = "") -> str:
    if at is None:
        return ""
    minutes = max(0, round((at - now).total_seconds() / 60))
    because = f" ({reason})" if reason else ""
    return (f"If it stays idle, it is culled at {at.strftime('%H:%M')} UTC (in {minutes} min){because}; "
            "any activity in it moves this on.")


async def booking_notices(handler, viewer: views.Viewer) -> dict[str, str]:
    """{server: warning} where someone else booked the viewer's GPU later (bookings.notices)."""
    from .bookings import notices

    try:
        return {(f"{viewer.name}/{n}" if n else viewer.name): t for n, t in (await notices(handler, viewer)).items()}
    except PoolError as exc:
        log.warning("No booking notices: %s", exc)
        return {}


async def budget_rows(handler, viewer: views.Viewer) -> list[dict]:
    """The viewer's GPU-hour budgets: used, limit, when the next hour frees, when what they hold
    uses it up (the warning before the culler stops it with reason `budget`)."""
    user = handler.current_user if isinstance(handler.current_user, dict) else {}
    groups = tuple(user.get("groups") or ())  # the hub's user model (read:users:groups)
    if not handler.pool.budgets().any:
        return []
    try:
        found = await handler.ledger(handler.pool.budget_standings, viewer.name, groups)
    except PoolError as exc:
        log.warning("No budgets: %s", exc)
        return []
    period = handler.pool.budgets().period_s
    return [{"who": s.who, "used_gpu_hours": round(s.used, 2), "limit_gpu_hours": s.limit,
             "exhausted": s.exhausted, "frees_at": iso(s.frees_at), "runs_out_at": iso(s.runs_out_at),
             "message": s.message(period) + (f"; what you hold now uses it up at "
                                             f"{s.runs_out_at.strftime('%a %H:%M')} UTC, when it is stopped"
                                             if s.runs_out_at and not s.exhausted else "")} for s in found]


async def page_context(handler, viewer: views.Viewer, gpus: list[dict], queue: list[dict], active: list[dict]) -> dict:
    info = await live(handler, gpus, queue, viewer)
    now = datetime.now(UTC)
    for lease in active:
        key = (viewer.name, lease["server_name"])
        lease["cull"] = cull_text(info["cull"].get(key), now, info["why"].get(key, ""))
    return {"estimate_note": estimate.NOTE if info["estimated"] else None,
            "budgets": await budget_rows(handler, viewer)}


async def borrowed_notices(handler, viewer: views.Viewer) -> dict[str, dict]:
    """The viewer's own borrowed leases ({"alice" or "alice/name" or "alice/job/7": what
    server_reclaim.borrowed_part says}); empty when the ledger does not answer."""
    try:
        leases = await handler.ledger(handler.pool.leases, viewer.name)
    except PoolError as exc:
        log.warning("No borrowed notices: %s", exc)
        return {}
    now = datetime.now(UTC)
    found = {}
    for lease in leases:
        part = borrowed_part(lease, handler.pool.reclaim_grace, now)
        if part is not None:
            found[f"{lease.user}/{lease.server_name}" if lease.server_name else lease.user] = part
    return found


class WaitAPI(APIHandler):
    """GET api/wait: the queue with estimated waits, GPU utilization and memory, the caller's cull
    deadlines and borrowed leases."""

    async def get(self):
        viewer = self.require_viewer()
        gpus = views.gpu_rows(await self.call(self.pool.gpus), viewer)
        queue = views.queue_rows(await self.call(self.pool.queue), viewer)
        info = await live(self, gpus, queue, viewer)
        mine = {f"{u}/{n}" if n else u: iso(t) for (u, n), t in info["cull"].items() if u == viewer.name}
        reasons = {f"{u}/{n}" if n else u: r for (u, n), r in info["why"].items() if u == viewer.name}
        self.write_json({"queue": queue, "note": estimate.NOTE,
                         "utilization": {g["uuid"]: g["utilization"] for g in gpus},
                         "memory_used_mib": {g["uuid"]: g["memory_used_mib"] for g in gpus},
                         "cull_at": mine, "cull_reason": reasons,
                         "budgets": await budget_rows(self, viewer),
                         "booked": await booking_notices(self, viewer),
                         "borrowed": await borrowed_notices(self, viewer)})


def routes(prefix: str) -> list:
    return [(url_path_join(prefix, "api", "wait"), WaitAPI)]
