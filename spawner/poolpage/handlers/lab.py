"""GET api/lab: what a person's JupyterLab shows about their own server (images/jupyter).

The notebook server asks with its own token (its scopes include access to this
service, see settings/pool_service.py SERVER_TOKEN_SCOPES) through the `gpuhub_activity`
server extension, which the in-lab extension polls.  The answer is about the caller
only, whoever they are (a pool admin's server token carries no admin scope, and the
handler ignores it anyway): their server's lease (borrowed beyond their share: the notice, and once it is asked back,
when the server stops) and its GPUs with the pool's
readings (utilisation and memory in use: the numbers of the pool page), the idle-cull deadline by the culler's own
rule (culling/policy.py cull_deadline), their queued and running jobs, and the pool's free
GPUs per profile (which everyone may see on the page).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

from jupyterhub.utils import url_path_join
from tornado import web

from ...culling.deadline import contended
from ...culling.policy import is_gpu_server, server_idle_limit
from ...pool.ledger.job_records import QUEUED, RUNNING
from ...pool.models import EndReason, PoolError, iso
from ...profiles import ProfileConfigError, load_profiles
from ...services.hub_api import HubUnavailable
from .. import views
from ..server_reclaim import borrowed_part
from .actions import hub_api
from .base import APIHandler, log
from .wait import fill_readings, settings_of

# A server name as JupyterHub allows it, bounded (the hub itself caps names at 255).
SERVER_NAME = re.compile(r"^[^/\x00-\x1f]{0,255}$")
# How long an ended lease is still told about ("an admin ended your lease").
ENDED_NOTICE = timedelta(hours=1)
# At most this many of the caller's jobs are listed (the newest first).
MAX_JOBS = 20


def free_per_profile(gpus: list[dict], profiles, hosts_matching=None) -> list[dict]:
    """Each GPU profile: how many free GPUs it could be lent (on the hosts it may use: those
    whose node labels it asks for, where `hosts_matching` can tell) and whether it could start
    now (a lease is on one host, so what counts is the most free GPUs on any one of them)."""
    per_host: dict[str, int] = {}
    for g in gpus:
        if g["state"] == "free":
            per_host[g["host"]] = per_host.get(g["host"], 0) + 1
    out = []
    for p in profiles:
        if p.gpus <= 0:
            continue
        hosts = None
        if p.node_labels and hosts_matching is not None:
            hosts = set(hosts_matching(dict(p.node_labels)))
        mine = {h: n for h, n in per_host.items() if hosts is None or h in hosts}
        out.append({"slug": p.slug, "display_name": p.display_name, "gpus": p.gpus,
                    "free": sum(mine.values()), "available": max(mine.values(), default=0) >= p.gpus})
    return out


def lease_part(lease, gpus: list[dict], now: datetime) -> dict:
    mine = [g for g in gpus if g["lease_id"] == lease.id]
    return {
        "id": lease.id,
        "since": iso(lease.started_at),
        "host": lease.host,
        "gpu_hours": round(lease.gpu_hours(until=now), 3),
        "gpus": [{k: g[k] for k in ("index", "uuid", "model", "memory_mib", "utilization", "memory_used_mib",
                                    "drained", "drained_at")} for g in mine],
    }


def ended_part(history: list, server: str, now: datetime) -> dict | None:
    """The server's last lease, when it ended within ENDED_NOTICE (so JupyterLab can say why)."""
    ended = [l for l in history if l.server_name == server and l.ended_at is not None
             and now - l.ended_at <= ENDED_NOTICE]
    if not ended:
        return None
    last = max(ended, key=lambda l: l.ended_at)
    return {"id": last.id, "ended_at": iso(last.ended_at), "reason": last.end_reason,
            "by_admin": last.end_reason == EndReason.ADMIN.value}


class LabAPI(APIHandler):
    """GET api/lab?server=NAME: the caller's own server, as their JupyterLab shows it."""

    async def get(self):
        viewer = self.require_viewer()
        # Only ever the caller's own things, whatever scopes the token has.
        viewer = views.Viewer(name=viewer.name)
        server = self.get_argument("server", "")
        if not SERVER_NAME.match(server):
            raise web.HTTPError(400, "server must be a server name of at most 255 characters")
        now = datetime.now(UTC)
        s = settings_of(self)
        gpus = views.gpu_rows(await self.call(self.pool.gpus), viewer)
        leases = [l for l in await self.call(self.pool.leases, viewer.name) if l.server_name == server]
        lease = leases[0] if leases else None
        if lease is not None:
            await fill_readings(self, [g for g in gpus if g["lease_id"] == lease.id])
        ended = ending = None
        booked = None
        if lease is not None:
            ending = await self.ending_part(lease.id)
            # One of its GPUs booked later for someone else: when, and how long it has (pool/fair_use/bookings.py).
            booked = await self.call(self.pool.booking_notice_for, lease.host, lease.gpu_uuids, viewer.name,
                                     lease.groups)
        else:
            ended = ended_part(await self.call(self.pool.history, viewer.name, now - ENDED_NOTICE), server, now)
        self.write_json({
            "user": viewer.name,
            "server": server,
            "now": iso(now),
            "lease": dict(lease_part(lease, gpus, now), booked=booked,
                          borrowed=borrowed_part(lease, self.pool.reclaim_grace, now)) if lease is not None else None,
            "ended": ended,
            "ending": ending,
            "cull": await self.cull_part(viewer.name, server, s),
            "jobs": self.jobs_part(viewer.name),
            "free": {"gpus": sum(1 for g in gpus if g["state"] == "free"),
                     "profiles": await self.profiles_part(gpus)},
            "pool_url": self.settings["prefix"],
        })

    async def ending_part(self, lease_id: int) -> dict | None:
        """Why the lease is ending, while its server stops: the reason the pool page (an admin) or
        the culler recorded before asking the hub to stop it (pool end intents).  The stopping
        server asks once, and tells its open tabs (images/jupyter/gpuhub_activity/notice.py)."""
        try:
            intent = await self.ledger(self.pool.end_intent, lease_id)
        except PoolError as exc:
            log.warning("No end reason for lease %s: %s", lease_id, exc)
            return None
        if intent is None:
            return None
        reason = intent[0]
        return {"reason": reason, "by_admin": reason == EndReason.ADMIN.value}

    async def cull_part(self, user: str, server: str, s) -> dict:
        part = {"at": None, "idle_limit_s": None, "check_every_s": s.cull_every or None,
                "culling": s.cull_timeout > 0 or s.cull_timeout_cpu > 0, "busy_kernels_count": True,
                "last_activity": None, "gpu_idle_rule": None}
        if not part["culling"]:
            return part
        try:
            mine = [srv for srv in await hub_api(self).servers_of_user(user) if srv.name == server]
        except HubUnavailable as exc:
            log.warning("No cull deadline for %s: %s", user, exc)
            return {**part, "error": "The hub did not say when this server was last active"}
        if mine:
            srv = mine[0]
            # Whether someone waits for GPUs on its host: the contended timeout then applies, as the
            # culler applies it (culling/deadline.py), and the deadline moves when that changes.
            busy = False
            if is_gpu_server(srv.state):
                try:
                    busy = contended(srv.host, [w.hosts for w in await self.ledger(self.pool.queue)])
                except PoolError as exc:
                    log.warning("Cull deadline without the queue: %s", exc)
            deadline = s.deadline(srv, busy)
            part.update(at=iso(deadline) if deadline else None, last_activity=iso(srv.last_activity),
                        idle_limit_s=server_idle_limit(srv.state, s.cull_timeout_cpu, s.cull_timeout,
                                                       s.cull_rules, busy),
                        contended=busy)
            if is_gpu_server(srv.state) and s.gpu_idle_percent > 0:
                # The culler's other rule (GPUCullPolicy): GPUs under this for this long, whatever
                # the activity says.
                part["gpu_idle_rule"] = {"percent": s.gpu_idle_percent, "seconds": s.gpu_idle_seconds}
        return part

    def jobs_part(self, user: str) -> list[dict] | None:
        runner = self.settings.get("jobs")
        if runner is None:
            return None  # jobs are off on this hub
        prefix = self.settings["prefix"]
        rows = [j for j in runner.snapshot if j["user"] == user and j["state"] in (QUEUED, RUNNING)]
        rows.sort(key=lambda j: j["id"], reverse=True)
        return [{"id": j["id"], "state": j["state"], "profile": j["profile"], "command": j["command"],
                 "submitted_at": j["submitted_at"], "started_at": j["started_at"],
                 "url": url_path_join(prefix, "jobs", str(j["id"])),
                 "logs_url": url_path_join(prefix, "api", "jobs", str(j["id"]), "logs")}
                for j in rows[:MAX_JOBS]]

    async def profiles_part(self, gpus: list[dict]) -> list[dict]:
        profiles = self.settings.get("lab_profiles") or []
        inventory = getattr(self.pool, "inventory", None)
        if inventory is None or not inventory.multi_host or not any(p.node_labels for p in profiles):
            return free_per_profile(gpus, profiles)
        try:  # the Swarm's node labels: a manager call, off the loop
            return await asyncio.to_thread(free_per_profile, gpus, profiles, inventory.hosts_matching)
        except Exception as exc:  # unreadable: the counts of every host
            log.warning("Free GPUs per profile without the node labels: %s", exc)
            return free_per_profile(gpus, profiles)


def lab_profiles(runner, page) -> list:
    """The GPU profiles the panel counts free GPUs for, read once: the jobs runner's, else those
    the hub wrote into the service's settings (PoolPageSettings.profiles)."""
    if runner is not None:
        return list(runner.profiles.values())
    try:
        return load_profiles(page.profiles) if page.profiles else []
    except ProfileConfigError as exc:  # the hub checked them at start; said, not shown
        log.warning("The profiles in the service's settings are not usable: %s", exc)
        return []


def routes(prefix: str) -> list:
    return [(url_path_join(prefix, "api", "lab"), LabAPI)]
