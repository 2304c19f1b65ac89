"""The gpu-pool service's job endpoints: /api/jobs (REST), /jobs/<id> (a job's page) and
/jobs/new (the pool page's form to submit a job or a cluster).

Submitting needs the `custom:gpu-jobs` scope (every user has it; a notebook
server's own token too); a job is seen and cancelled only by its owner or a
pool admin.  The JobRunner (spawner/jobs/runner.py) does the work.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from jupyterhub.utils import url_path_join
from tornado import web
from tornado.http1connection import HTTP1Connection
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.iostream import StreamClosedError

from ...jobs import JOBS_SCOPE, cluster
from ...jobs.engine import UnitGone
from ...jobs.reclaim import borrowed_notice
from ...jobs.request import BadJob, check_submission
from ...jobs.runner import JobError, JobRunner
from ...jobs.scheduler import Scheduler
from ...pool.ledger.job_records import QUEUED, RUNNING, STARTING, Job
from .. import ADMIN_SCOPE, views
from ..limits import PoolServiceLimits
from .base import APIHandler, BaseHandler, log, path_id
from .lab import free_per_profile
from .log_streams import Followers, LogFollow, MergedFollow, TooMany

MAX_BODY = 64 * 1024
# A follower of a job that another host's service runs (no news from this runner) reads its state this often.
RECHECK_SECONDS = 30.0
# Opening Docker log streams (a client and its first answer): blocking, off the event loop.
_STREAMS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpu-pool-log-open")


class JobsMixin:
    hub_auth: Any  # HubOAuthenticated's, on the handlers this is mixed into
    # Supplied by the handler it is mixed into (declared for the type checker only).
    settings: dict[str, Any]
    current_user: Any
    call: Callable[..., Coroutine[Any, Any, Any]]

    @property
    def runner(self) -> JobRunner:
        runner = self.settings.get("jobs")
        if runner is None:
            raise web.HTTPError(404, "Jobs are off on this hub (GPUHUB_JOBS=false)")
        return runner

    def job_user(self) -> tuple[str, bool]:
        """(name, is pool admin) of a caller allowed to use jobs; else 403 (404 if jobs are off:
        the scope is then not even defined, and a 403 would send people looking for it)."""
        self.runner  # noqa: B018 (raises the 404)
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
        job = await self.call(self.runner.ledger.get, path_id(job_id, f"No job {job_id[:40]} of yours"))
        # Someone else's job is "not found", not "forbidden": ids reveal nothing.
        if job is None or (job.user != name and not admin):
            raise web.HTTPError(404, f"No job {job_id} of yours")
        return job, name, admin

    async def job_dict(self, job: Job) -> dict:
        data = job.to_dict()
        data["queue_position"] = await self.runner.position(job)
        data["booking_notice"] = None
        if job.state == RUNNING and job.host and job.gpu_uuids:
            # One of its GPUs booked later for someone else: the job is stopped then (pool/fair_use/stops.py).
            data["booking_notice"] = await self.call(self.runner.pool.booking_notice_for, job.host, job.gpu_uuids,
                                                     job.user, job.groups, "this job")
        # On borrowed GPUs (beyond its user's share): how much notice a reclaim gives, or that one runs.
        borrowed = await borrowed_notice(self.runner, job)
        data["borrowed"] = bool(borrowed)
        data["borrowed_notice"] = borrowed["notice"] if borrowed else None
        data["reclaim_at"] = borrowed["reclaim_at"] if borrowed else None
        return data

    async def submit_body(self, name: str, body) -> Job:
        """Check a submission (as REST and the page's form send it) and queue it; HTTPError if refused."""
        hub_user = await self.hub_user(name)
        groups = sorted(hub_user.get("groups") or [])
        runner = self.runner
        try:
            sub = check_submission(body, list(runner.profiles.values()), groups, runner.settings.max_seconds,
                                   runner.limits.max_workers, runner.limits.max_parameters_bytes)
            return await runner.submit(name, groups, hub_user.get("auth_state"), sub)
        except (BadJob, JobError) as exc:
            raise web.HTTPError(exc.status, str(exc)) from None

    async def hub_user(self, name: str) -> dict:
        """The user's model from the hub (groups; auth_state with the directory uid/gid)."""
        return await fetch_hub_user(self.hub_auth.api_url, self.hub_auth.api_token, name)


async def fetch_hub_user(api_url: str, api_token: str, name: str) -> dict:
    """User `name`'s model from the hub's API, with the service's token; HTTPError 503 if the hub
    did not answer (404 if it has no such user)."""
    request = HTTPRequest(url_path_join(api_url, "users", quote(name, safe="")),
                          headers={"Authorization": f"token {api_token}"}, request_timeout=20)
    try:
        response = await AsyncHTTPClient().fetch(request)
    except Exception as exc:
        if getattr(exc, "code", None) == 404:
            raise web.HTTPError(404, f"The hub has no user {name!r} any more") from None
        log.error("Could not read user %s from the hub: %s", name, exc)
        raise web.HTTPError(503, "The hub did not answer; try again in a moment") from None
    return json.loads(response.body)


class JobsAPI(JobsMixin, APIHandler):
    async def get(self):
        name, admin = self.job_user()
        everyone = admin and self.get_argument("all", "") in ("1", "true", "yes")
        jobs = await self.call(self.runner.ledger.jobs, None if everyone else name)
        self.write_json({"jobs": [await self.job_dict(j) for j in jobs]})

    async def post(self):
        name, _ = self.job_user()
        body = self.json_body(MAX_BODY)
        job = await self.submit_body(name, body)
        self.set_header("Location", url_path_join(self.request.path, str(job.id)))
        self.write_json(await self.job_dict(job), status=201)


class JobProfilesAPI(JobsMixin, APIHandler):
    """GET api/jobs/profiles: the profiles the caller may run jobs with (their groups allow
    them), each with the free GPUs it could be lent now, as JupyterLab's GPU panel counts them.
    What Jupyter Scheduler's environment choice lists (images/jupyter/gpuhub_scheduler)."""

    async def get(self):
        name, _ = self.job_user()
        groups = (await self.hub_user(name)).get("groups") or []
        mine = [p for p in self.runner.profiles.values() if p.allows(groups)]
        gpus = views.gpu_rows(await self.call(self.pool.gpus), views.Viewer(name=name))
        free = {f["slug"]: f for f in free_per_profile(gpus, mine)}
        self.write_json({"profiles": [
            {"slug": p.slug, "display_name": p.display_name, "gpus": p.gpus,
             "free": free[p.slug]["free"] if p.slug in free else None,
             "available": free[p.slug]["available"] if p.slug in free else True}
            for p in mine]})


def form_body(get) -> dict:
    """A submission from the page's form fields (`get(name)` -> str or None), as REST takes it:
    the command line split as a shell would (no shell runs it), numbers as numbers."""
    body: dict = {"profile": get("profile") or None}
    line = get("command") or ""
    if len(line) > MAX_BODY:
        raise BadJob(f"The command is longer than {MAX_BODY} characters")
    try:
        body["command"] = shlex.split(line)
    except ValueError as exc:
        raise BadJob(f"The command line does not parse ({exc}); check its quotes") from None
    for key in ("workdir",):
        if get(key):
            body[key] = get(key)
    for key in ("workers", "timeout"):
        raw = (get(key) or "").strip()
        if raw:
            if not raw.isdigit() or len(raw) > 18:  # (more digits than any limit: never one for int())
                raise BadJob(f"'{key}' must be a whole number, not {raw[:20]!r}")
            body[key] = int(raw)
    return body


class JobSubmitPage(JobsMixin, BaseHandler):
    """The pool page's form: a job or a cluster from the browser, as REST takes it; then its page."""

    @web.authenticated
    async def post(self):
        name, _ = self.job_user()
        try:
            body = form_body(lambda key: self.get_body_argument(key, None))
        except BadJob as exc:
            raise web.HTTPError(exc.status, str(exc)) from None
        job = await self.submit_body(name, body)
        log.info("%s submitted job %s from the pool page", name, job.id)
        self.redirect(url_path_join(self.settings["prefix"], "jobs", str(job.id)))

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.log_message if isinstance(exc, web.HTTPError) and exc.log_message else self._reason
        self.finish(self.settings["jinja"].get_template("message.html").render(
            title="Job not submitted", message=message, base_url=self.settings["base_url"],
            prefix=self.settings["prefix"]))


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
    the kept copy afterwards.  A cluster's is every worker's, each line marked `[worker i]`
    (followed too: every worker's stream at once, line by line); `?worker=i` gives one
    worker's, unmarked.  Followers are capped (PoolServiceLimits; a cluster's follower is one,
    whatever its workers), wait for a queued job on the runner's own news of it, and end
    their Docker streams when they go."""

    _follow: LogFollow | MergedFollow | None = None
    _gone: asyncio.Event | None = None

    async def get(self, job_id: str):
        job, name, _ = await self.owned_job(job_id)
        follow = self.get_argument("follow", "") in ("1", "true", "yes")
        worker = self.worker_argument(job)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        if follow:
            followers: Followers = self.settings["followers"]
            try:
                followers.take(job.id, name)
            except TooMany as exc:
                raise web.HTTPError(429, str(exc)) from None
            self._gone = asyncio.Event()
            followed = job.id
            try:
                running = await self.until_it_runs(job)
                if running is None:
                    return  # the reader went away meanwhile
                job = running
                if job.active and job.container and await self.stream(job, worker):
                    return self.finish()
            finally:
                followers.give_back(followed, name)
        if job.active and job.container:
            current = await self.runner.read_log(job, worker)
            if current is not None:
                return self.finish(current)
        kept = await self.call(self.runner.ledger.log, job.id) or ""
        self.finish(cluster.worker_log(kept, worker) if worker is not None else kept)

    def worker_argument(self, job: Job) -> int | None:
        """`?worker=i` of a cluster job (0 <= i < its workers), else None; 400 when it is not one."""
        raw = self.get_argument("worker", None)
        if raw is None:
            return None
        if not job.is_cluster:
            raise web.HTTPError(400, f"Job {job.id} is not a cluster; it has no workers to choose from")
        if not raw.isdigit() or len(raw) > len(str(job.workers)) or not int(raw) < job.workers:
            raise web.HTTPError(400, f"'worker' must be a worker of job {job.id}: 0 to {job.workers - 1}")
        return int(raw)

    def on_connection_close(self):
        if self._gone is not None:
            self._gone.set()
        if self._follow is not None:
            self._follow.close()

    async def until_it_runs(self, job: Job) -> Job | None:
        """The job once it has left the queue and its start (None if the reader left first):
        woken by the runner when it moves the job on; the ledger is read again only then, and
        every RECHECK_SECONDS for a job another host's service runs."""
        reader_gone = self._gone
        if reader_gone is None:  # get() makes it when a follow starts
            raise RuntimeError("A job log's follow was used before get() started it")
        while job.state in (QUEUED, STARTING):
            moved = asyncio.ensure_future(self.runner.moved(job.id).wait())
            gone = asyncio.ensure_future(reader_gone.wait())
            try:
                await asyncio.wait({moved, gone}, timeout=RECHECK_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
                gone.cancel()
            if reader_gone.is_set():
                return None
            job = await self.call(self.runner.ledger.get, job.id) or job
        return job

    async def stream(self, job: Job, worker: int | None = None) -> bool:
        """Stream the container's log until it ends or the reader goes; False if the container
        is already gone.  A cluster's: worker `worker`'s, or else every worker's at once, whole
        lines marked `[worker i]` as the log that is not followed marks them.  The engine's
        streams are opened on threads, each within PoolServiceLimits.docker_timeout."""
        reader_gone = self._gone
        if reader_gone is None:  # get() makes it when a follow starts
            raise RuntimeError("A job log's follow was used before get() started it")
        if not job.container:
            return False  # no container (yet or any more): nothing to follow; get() checks first
        limits: PoolServiceLimits = self.settings["limits"]
        follow: LogFollow | MergedFollow
        names = self.runner.group(job).names
        if job.is_cluster and worker is None:
            indexes = range(job.workers)
            opened = await asyncio.gather(*(self.open_follow(job, names[i]) for i in indexes),
                                          return_exceptions=True)
            follows = [(i, f) for i, f in zip(indexes, opened) if isinstance(f, LogFollow)]
            failed = [f for f in opened if isinstance(f, BaseException)]
            if failed:
                for _, f in follows:
                    f.close()
                raise failed[0]
            if not follows:
                return False
            self._follow = follow = MergedFollow(follows)
        else:
            unit = names[worker] if worker is not None else job.container
            if (one := await self.open_follow(job, unit)) is None:
                return False
            self._follow = follow = one
        try:
            if reader_gone.is_set():
                return True
            while (chunk := await follow.next_chunk()) is not None:
                self.write(chunk)
                try:
                    await asyncio.wait_for(self.flush(), limits.log_stall_timeout)
                except TimeoutError:
                    log.info("A follower of job %s's log took nothing for %g s; dropped it",
                             job.id, limits.log_stall_timeout)
                    if isinstance(self.request.connection, HTTP1Connection):  # what tornado's server gives
                        self.request.connection.close()
                    break
                except StreamClosedError:
                    break  # the reader left
        finally:
            follow.close()
        return True

    async def open_follow(self, job: Job, unit: str) -> LogFollow | None:
        """A follow of one unit's log (None if the unit is gone); 503 if Docker does not open it in time."""
        limits: PoolServiceLimits = self.settings["limits"]
        loop = asyncio.get_running_loop()
        opening = loop.run_in_executor(_STREAMS, self.runner.engine.open_follow, unit, limits.docker_timeout)
        try:
            api, source = await asyncio.wait_for(asyncio.shield(opening), limits.docker_timeout + 1)
        except UnitGone:
            return None
        except Exception as exc:
            log.warning("Could not open job %s's log stream (%s): %s", job.id, unit, exc)
            opening.add_done_callback(_close_late)
            raise web.HTTPError(503, f"Docker did not open job {job.id}'s log within "
                                     f"{limits.docker_timeout:g} s; try again in a moment") from None
        return LogFollow(source, limits.log_buffer_chunks, client=api)


def _close_late(opening: asyncio.Future) -> None:
    """A stream that opened after its caller gave up: close it."""
    if not opening.cancelled() and opening.exception() is None:
        api, source = opening.result()
        try:
            source.close()
        finally:
            api.close()


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
        (api + "/profiles", JobProfilesAPI),
        (api + r"/(\d+)", JobAPI),
        (api + r"/(\d+)/logs", JobLogsAPI),
        (url_path_join(prefix, "jobs") + r"/(\d+)", JobPage),
        (url_path_join(prefix, "jobs", "new"), JobSubmitPage),
    ]


def job_rows(runner: JobRunner | None, viewer) -> list[dict]:
    """The jobs the pool page lists (the viewer's; a pool admin's: everyone's), from the
    runner's snapshot, so rendering the page never waits on the ledger."""
    if runner is None:
        return []
    return [j for j in runner.snapshot if viewer.admin or j["user"] == viewer.name]


def job_profiles(runner: JobRunner | None) -> list[dict]:
    """The profiles the page's submit form offers (the service checks who may use which)."""
    if runner is None:
        return []
    return [{"slug": p.slug, "name": p.display_name, "gpus": p.gpus} for p in runner.profiles.values()]


def make_scheduler(runner: JobRunner | None) -> Scheduler | None:
    """The schedules' scheduler where jobs run; it reads users from the hub with the service's
    own token (the service's environment, as HubAuth reads it)."""
    if runner is None:
        return None

    async def hub_user(name: str) -> dict:
        from jupyterhub.services.auth import HubAuth

        auth = HubAuth()
        return await fetch_hub_user(auth.api_url, auth.api_token, name)
    return Scheduler(runner, hub_user)


async def start_jobs(app: web.Application):
    """Take up the jobs, then fire the schedules; returns the coroutine function that stops them.
    (The containers reach the jobs API on the hub's bridge, where the service listens for them:
    app.serve.)"""
    runner: JobRunner | None = app.settings.get("jobs")
    scheduler: Scheduler | None = app.settings.get("scheduler")
    if runner is None:
        async def nothing():
            pass
        return nothing
    await runner.start()
    if scheduler is not None:
        scheduler.start()

    async def stop():
        if scheduler is not None:
            await scheduler.stop()
        await runner.stop()
    return stop
