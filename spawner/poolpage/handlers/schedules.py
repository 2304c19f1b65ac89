"""The gpu-pool service's schedules: api/schedules (GET, POST), api/schedules/ID (GET, DELETE),
api/schedules/ID/pause and /resume (POST).

A schedule is a job (a command or a notebook, as api/jobs takes it) and a cron string; the
service keeps it in the ledger and fires it (spawner/jobs/scheduler.py) whether or not its
user's server runs.  The same scope as jobs (`custom:gpu-jobs`); a schedule is seen, paused
and deleted only by its owner or a pool admin (who lists everyone's with `?all=1`).  Every
limit is c.ScheduleLimits' (spawner/jobs/schedules.py); a refused body changes nothing.
"""

from __future__ import annotations

from jupyterhub.utils import url_path_join
from tornado import web

from ...jobs import cron
from ...jobs.request import BadJob
from ...jobs.runner import JobError
from ...jobs.scheduler import Scheduler
from ...jobs.schedules import ScheduleLimits, check_schedule
from ...pool.ledger.schedule_records import Schedule
from .base import APIHandler, log, path_id
from .jobs import JobsMixin

MAX_BODY = 64 * 1024


class SchedulesMixin(JobsMixin):
    @property
    def scheduler(self) -> Scheduler:
        self.runner  # noqa: B018 (404 when jobs are off)
        return self.settings["scheduler"]

    async def owned_schedule(self, schedule_id: str) -> tuple[Schedule, str]:
        name, admin = self.job_user()
        found = await self.call(self.scheduler.ledger.get,
                                path_id(schedule_id, f"No schedule {schedule_id[:40]} of yours"))
        if found is None or (found.user != name and not admin):
            raise web.HTTPError(404, f"No schedule {schedule_id} of yours")
        return found, name

    def schedule_dict(self, schedule: Schedule) -> dict:
        data = schedule.to_dict()
        after = cron.next_times(schedule.cron, schedule.next_at, 2) if schedule.next_at is not None else []
        data["next_times"] = [t.isoformat() for t in ([schedule.next_at] if schedule.next_at else []) + after]
        return data


class SchedulesAPI(SchedulesMixin, APIHandler):
    async def get(self):
        name, admin = self.job_user()
        everyone = admin and self.get_argument("all", "") in ("1", "true", "yes")
        found = await self.call(self.scheduler.ledger.schedules, None if everyone else name)
        self.write_json({"schedules": [self.schedule_dict(s) for s in found],
                         "limits": limits_dict(self.scheduler.limits)})

    async def post(self):
        name, _ = self.job_user()
        body = self.json_body(MAX_BODY)
        scheduler, runner = self.scheduler, self.runner
        hub_user = await self.hub_user(name)
        groups = sorted(hub_user.get("groups") or [])
        try:
            asked = check_schedule(body, list(runner.profiles.values()), groups, runner.settings.max_seconds,
                                   scheduler.limits, scheduler.clock(), runner.limits.max_parameters_bytes)
            if asked.submission.notebook:
                await runner.check_notebook(name, asked.submission.notebook)
            created = await self.call(scheduler.ledger.create, name, asked.name, asked.cron, asked.body,
                                      runner.settings.host,
                                      lambda now: cron.next_times(asked.cron, now, 1)[0],
                                      check=scheduler.limits.check_count)
        except (BadJob, JobError) as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        log.info("%s made schedule %s (%s)", name, created.id, created.cron)
        self.set_header("Location", url_path_join(self.request.path, str(created.id)))
        self.write_json(self.schedule_dict(created), status=201)


class ScheduleAPI(SchedulesMixin, APIHandler):
    async def get(self, schedule_id: str):
        found, _ = await self.owned_schedule(schedule_id)
        self.write_json(self.schedule_dict(found))

    async def delete(self, schedule_id: str):
        found, name = await self.owned_schedule(schedule_id)
        await self.call(self.scheduler.ledger.delete, found.id)
        log.info("%s deleted schedule %s of %s", name, found.id, found.user)
        self.set_status(204)
        self.finish()


class ScheduleActionAPI(SchedulesMixin, APIHandler):
    async def post(self, schedule_id: str, action: str):
        found, name = await self.owned_schedule(schedule_id)
        scheduler = self.scheduler
        paused = action == "pause"
        # Resumed, it fires next at its first slot from now (the slots while paused are skipped).
        next_at = None if paused else cron.next_times(found.cron, scheduler.clock(), 1)[0]
        updated = await self.call(scheduler.ledger.set_paused, found.id, paused, next_at)
        if updated is None:
            raise web.HTTPError(404, f"No schedule {schedule_id} of yours")
        log.info("%s: %s schedule %s of %s", name, action, found.id, found.user)
        self.write_json(self.schedule_dict(updated))


def schedule_rows(scheduler: Scheduler | None, viewer) -> list[dict]:
    """The schedules the pool page lists (the viewer's; a pool admin's: everyone's), from the
    scheduler's snapshot."""
    if scheduler is None:
        return []
    return [s for s in scheduler.snapshot if viewer.admin or s["user"] == viewer.name]


def limits_dict(limits: ScheduleLimits) -> dict:
    return {"max_per_user": limits.max_per_user, "min_interval_minutes": limits.min_interval_minutes,
            "max_run_seconds": limits.max_run_seconds}


def routes(prefix: str) -> list[tuple]:
    api = url_path_join(prefix, "api", "schedules")
    return [
        (api, SchedulesAPI),
        (api + r"/(\d+)", ScheduleAPI),
        (api + r"/(\d+)/(pause|resume)", ScheduleActionAPI),
    ]
