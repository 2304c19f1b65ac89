"""The gpu-pool service's job endpoints: /api/jobs (REST) and /jobs/<id> (a job's page).

Submitting needs the `custom:gpu-jobs` scope (every user has it; a notebook
server's own token too); a job is seen and cancelled only by its owner or a
pool admin.  The JobRunner (spawner/jobs/runner.py) does the work.
"""

from __future__ import annotations

import asyncio
import json
import threading
from urllib.parse import quote

from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.iostream import StreamClosedError

from ..jobs import JOBS_SCOPE
from ..jobs.request import BadJob, check_submission
from ..jobs.runner import JobError, JobRunner
from ..pool.jobs import QUEUED, STARTING, Job
from . import ADMIN_SCOPE
from .handlers import APIHandler, BaseHandler, log

MAX_BODY = 64 * 1024


class JobsMixin:
    @property
    def runner(self) -> JobRunner:
        runner = self.settings.get("jobs")
        if runner is None:
            raise web.HTTPError(404, "Jobs are off on this hub (GPUHUB_JOBS=false)")
        return runner

    def job_user(self) -> tuple[str, bool]:
        """(name, is pool admin) of a caller allowed to use jobs; else 403."""
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "Log in to the hub (or send a hub API token) first")
        scopes = set(user.get("scopes", ()))
        admin = ADMIN_SCOPE in scopes
        if not admin and not any(s == JOBS_SCOPE or s.startswith(JOBS_SCOPE + "!") for s in scopes):
            raise web.HTTPError(403, f"This needs the {JOBS_SCOPE} scope")
        return user["name"], admin

    async def owned_job(self, job_id: str) -> tuple[Job, str, bool]:
        name, admin = self.job_user()
        job = await self.call(self.runner.ledger.get, int(job_id))
        # Someone else's job is "not found", not "forbidden": ids reveal nothing.
        if job is None or (job.user != name and not admin):
            raise web.HTTPError(404, f"No job {job_id} of yours")
        return job, name, admin

    async def job_dict(self, job: Job) -> dict:
        data = job.to_dict()
        data["queue_position"] = await self.runner.position(job)
        return data


class JobsAPI(JobsMixin, APIHandler):
    async def get(self):
        name, admin = self.job_user()
        everyone = admin and self.get_argument("all", "") in ("1", "true", "yes")
        jobs = await self.call(self.runner.ledger.jobs, None if everyone else name)
        self.write_json({"jobs": [await self.job_dict(j) for j in jobs]})

    async def post(self):
        name, _ = self.job_user()
        if len(self.request.body) > MAX_BODY:
            raise web.HTTPError(400, f"The request body is larger than {MAX_BODY} bytes")
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "The body must be JSON") from None
        hub_user = await self.hub_user(name)
        groups = sorted(hub_user.get("groups") or [])
        runner = self.runner
        try:
            sub = check_submission(body, list(runner.profiles.values()), groups, runner.settings.max_seconds)
            job = await runner.submit(name, groups, hub_user.get("auth_state"), sub)
        except (BadJob, JobError) as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        self.set_header("Location", url_path_join(self.request.path, str(job.id)))
        self.write_json(await self.job_dict(job), status=201)

    async def hub_user(self, name: str) -> dict:
        """The user's model from the hub (groups; auth_state with the directory uid/gid)."""
        auth = self.hub_auth
        request = HTTPRequest(url_path_join(auth.api_url, "users", quote(name, safe="")),
                              headers={"Authorization": f"token {auth.api_token}"}, request_timeout=20)
        try:
            response = await AsyncHTTPClient().fetch(request)
        except Exception as exc:
            log.error("Could not read user %s from the hub: %s", name, exc)
            raise web.HTTPError(503, "The hub did not answer; try again in a moment") from None
        return json.loads(response.body)


class JobAPI(JobsMixin, APIHandler):
    async def get(self, job_id: str):
        job, _, _ = await self.owned_job(job_id)
        self.write_json(await self.job_dict(job))

    async def delete(self, job_id: str):
        job, name, _ = await self.owned_job(job_id)
        if not job.active:
            raise web.HTTPError(409, f"Job {job.id} has already ended ({job.public_state})")
        log.info("%s cancels job %s of %s", name, job.id, job.user)
        try:
            job = await self.runner.cancel(job.id)
        except JobError as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        self.write_json(await self.job_dict(job))


class JobLogsAPI(JobsMixin, APIHandler):
    """The job's output: its container's while it runs (`?follow=1` streams until it ends),
    the kept copy afterwards."""

    async def get(self, job_id: str):
        job, _, _ = await self.owned_job(job_id)
        follow = self.get_argument("follow", "") in ("1", "true", "yes")
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        while follow and job.state in (QUEUED, STARTING):  # nothing to follow yet
            await asyncio.sleep(1.0)
            job = await self.call(self.runner.ledger.get, job.id)
        if job.active and job.container:
            if follow and await self.stream(job):
                return self.finish()
            current = await self.runner.read_log(job)
            if current is not None:
                return self.finish(current)
        self.finish(await self.call(self.runner.ledger.log, job.id) or "")

    async def stream(self, job: Job) -> bool:
        """Stream the container's log until it ends; False if the container is already gone."""
        import docker
        import docker.errors

        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()
        api = docker.APIClient(**docker.utils.kwargs_from_env(), timeout=None)
        try:
            source = api.logs(job.container, stream=True, follow=True)
        except docker.errors.NotFound:
            return False

        def pump():  # Docker's stream blocks: read it on a thread of its own
            try:
                for chunk in source:
                    loop.call_soon_threadsafe(chunks.put_nowait, chunk)
            except Exception:
                pass
            finally:
                api.close()
                loop.call_soon_threadsafe(chunks.put_nowait, None)

        threading.Thread(target=pump, daemon=True, name=f"job-{job.id}-log").start()
        while (chunk := await chunks.get()) is not None:
            try:
                self.write(chunk)
                await self.flush()
            except StreamClosedError:
                break  # the reader left; the pump ends with the container
        return True


class JobPage(JobsMixin, BaseHandler):
    """A job's page: its state and log, and a cancel button for its owner or a pool admin."""

    @web.authenticated
    async def get(self, job_id: str):
        job, _, _ = await self.owned_job(job_id)
        output = await self.runner.read_log(job) if job.active and job.container else None
        if output is None:
            output = await self.call(self.runner.ledger.log, job.id) or ""
        html = self.settings["jinja"].get_template("job.html").render(
            job=job.to_dict(), log=output, position=await self.runner.position(job),
            xsrf=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
            base_url=self.settings["base_url"], prefix=self.settings["prefix"])
        self.finish(html)

    @web.authenticated
    async def post(self, job_id: str):
        job, name, _ = await self.owned_job(job_id)
        if job.active:
            log.info("%s cancels job %s of %s from the page", name, job.id, job.user)
            try:
                await self.runner.cancel(job.id)
            except JobError as exc:
                raise web.HTTPError(exc.status, str(exc)) from None
        self.redirect(url_path_join(self.settings["prefix"], "jobs", str(job.id)))

    async def call(self, fn, *args, **kwargs):
        return await self.ledger(fn, *args, **kwargs)


def routes(prefix: str) -> list[tuple]:
    api = url_path_join(prefix, "api", "jobs")
    return [
        (api, JobsAPI),
        (api + r"/(\d+)", JobAPI),
        (api + r"/(\d+)/logs", JobLogsAPI),
        (url_path_join(prefix, "jobs") + r"/(\d+)", JobPage),
    ]


def job_rows(runner: JobRunner | None, viewer) -> list[dict]:
    """The jobs the pool page lists (the viewer's; a pool admin's: everyone's), from the
    runner's snapshot, so rendering the page never waits on the ledger."""
    if runner is None:
        return []
    return [j for j in runner.snapshot if viewer.admin or j["user"] == viewer.name]


async def start_jobs(app: web.Application, port: int):
    """Take up the jobs and, when containers reach the service through the hub's bridge,
    listen there too; returns the coroutine function that stops both."""
    runner: JobRunner | None = app.settings.get("jobs")
    if runner is None:
        async def nothing():
            pass
        return nothing
    await runner.start()
    bridge = None
    if runner.settings.bridge_ip:
        from tornado.httpserver import HTTPServer

        bridge = HTTPServer(app)  # no xheaders: containers cannot claim another address
        bridge.listen(port, runner.settings.bridge_ip)
        log.info("Jobs API for containers on http://%s:%s%s", runner.settings.bridge_ip, port,
                 url_path_join(app.settings["prefix"], "api", "jobs"))

    async def stop():
        if bridge is not None:
            bridge.stop()
        await runner.stop()
    return stop
