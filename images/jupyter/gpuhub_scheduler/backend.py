"""Jupyter Scheduler's backend for GPU JupyterHub: notebook jobs run on the hub, not in this server.

"Create a notebook job" in JupyterLab comes here (jupyter_scheduler's REST handlers call a
`BaseScheduler`); "Run now" becomes a job of the hub's gpu-pool service (POST api/jobs),
"Run on a schedule" a schedule it keeps and fires (POST api/schedules), even while this
server is stopped or culled.  The job list, its status, "Stop" and the job definitions are
read from and sent to the same APIs; nothing is kept in this server, so the list also shows
jobs made with `gpu-job` and by schedules.  The executed notebook (and an HTML copy) lands
beside the input in the home (`train.job-12.ipynb`), where the list links to it.

The environment choice is the profiles this user may run jobs with (api/jobs/profiles),
with the free GPUs of each.  This server's own token ($JUPYTERHUB_API_TOKEN) and the
service's address ($GPUHUB_JOBS_URL), both set by the hub, are all it needs.  Configured in
the images' jupyter_server_config.d/gpuhub_scheduler.json; mapping.py holds the mapping.
"""

from __future__ import annotations

import json
import os
import posixpath
from urllib.parse import urlparse

from jupyter_scheduler.environments import EnvironmentManager, EnvironmentRetrievalError
from jupyter_scheduler.exceptions import SchedulerError
from jupyter_scheduler.executors import DefaultExecutionManager
from jupyter_scheduler.models import (
    DescribeJob,
    DescribeJobDefinition,
    JobFeature,
    ListJobDefinitionsResponse,
    ListJobsResponse,
    RuntimeEnvironment,
)
from jupyter_scheduler.scheduler import BaseScheduler
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from . import mapping

REQUEST_TIMEOUT = 30.0
# At most this many jobs are shown in the list (the newest first; api/jobs answers newest first).
MAX_LISTED = 500


def _jobs_url() -> str:
    return os.environ.get("GPUHUB_JOBS_URL", "")


async def hub_call(method: str, path: str, body: dict | None = None, api: str = "jobs"):
    """One call to the gpu-pool service with this server's token; SchedulerError with the
    service's own message (it names the limit or the reason) when it refuses."""
    base, token = _jobs_url(), os.environ.get("JUPYTERHUB_API_TOKEN", "")
    if not base or not token:
        raise SchedulerError("This server was not started by the hub's GPU pool ($GPUHUB_JOBS_URL is not set); "
                             "notebook jobs run only there")
    url = base.rstrip("/") + f"/api/{api}" + path
    request = HTTPRequest(url, method=method, body=None if body is None else json.dumps(body),
                          headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
                          request_timeout=REQUEST_TIMEOUT, connect_timeout=REQUEST_TIMEOUT,
                          allow_nonstandard_methods=True)
    try:
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
    except (OSError, HTTPClientError) as exc:
        raise SchedulerError(f"The hub's job service did not answer ({exc}); try again in a moment") from None
    if response.code >= 400:
        try:
            message = json.loads(response.body).get("message") or response.reason
        except (ValueError, AttributeError):
            message = response.reason
        raise SchedulerError(f"{message} (HTTP {response.code})")
    return json.loads(response.body) if response.body else None


class HubExecutionManager(DefaultExecutionManager):
    """Never executes here (the hub does); it tells the form which features the hub has."""

    def supported_features(cls):  # noqa: N805 (jupyter_scheduler calls it as cls.supported_features(cls))
        features = dict.fromkeys(JobFeature, False)
        features.update({JobFeature.job_name: True, JobFeature.parameters: True, JobFeature.output_formats: True,
                         JobFeature.job_definition: True, JobFeature.stop_job: True})
        return features


class HubEnvironmentManager(EnvironmentManager):
    """The environments are the profiles this user may run jobs with, with their free GPUs."""

    async def list_environments(self):
        try:
            found = await hub_call("GET", "/profiles")
        except SchedulerError as exc:
            raise EnvironmentRetrievalError(str(exc)) from None
        return [RuntimeEnvironment(**env) for env in mapping.environments(found["profiles"])]

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self):
        return dict(mapping.OUTPUT_FORMATS)


class HubScheduler(BaseScheduler):
    """Jupyter Scheduler's BaseScheduler on the hub's jobs and schedules APIs."""

    def __init__(self, root_dir, environments_manager, config=None, **kwargs):
        kwargs.pop("db_url", None)  # nothing is kept in this server
        super().__init__(root_dir=root_dir, environments_manager=environments_manager, config=config, **kwargs)
        self.execution_manager_class = HubExecutionManager
        self.task_runner = None
        self.home = os.environ.get("HOME") or root_dir

    # -- what the mapping needs from here ---------------------------------------------------
    def _page_url(self, hub_id: int) -> str:
        return posixpath.join(urlparse(_jobs_url()).path or "/", "jobs", str(hub_id))

    def _describe(self, job: dict) -> DescribeJob:
        fields = mapping.describe_job(job, self.root_dir, self.home, self._page_url(job["id"]), self.file_exists)
        return DescribeJob(**fields)

    # -- jobs -----------------------------------------------------------------------------
    async def create_job(self, model) -> str:
        try:
            body = mapping.create_job(model.dict(), self.root_dir, self.home)
        except mapping.MappingError as exc:
            raise SchedulerError(str(exc)) from None
        job = await hub_call("POST", "", body)
        self.log.info("gpuhub_scheduler: %s is job %s on the hub", model.input_uri, job["id"])
        return mapping.job_id(job["id"])

    async def get_job(self, job_id: str, job_files: bool | None = True) -> DescribeJob:
        return self._describe(await hub_call("GET", f"/{self._hub_id(job_id)}"))

    async def list_jobs(self, query) -> ListJobsResponse:
        jobs = (await hub_call("GET", ""))["jobs"][:MAX_LISTED]
        if query.job_definition_id:
            wanted = self._hub_id(query.job_definition_id, mapping.SCHEDULE_PREFIX)
            jobs = [j for j in jobs if j.get("schedule_id") == wanted]
        if query.status:
            jobs = [j for j in jobs if j.get("state") in mapping.STATES.get(str(query.status), ())]
        described = [self._describe(j) for j in jobs if j.get("notebook")]
        if query.name:
            described = [d for d in described if query.name.lower() in d.name.lower()]
        if query.start_time:
            described = [d for d in described if (d.start_time or 0) >= query.start_time]
        described.sort(key=lambda d: d.create_time, reverse=True)
        return ListJobsResponse(jobs=described, total_count=len(described))

    async def count_jobs(self, query) -> int:
        jobs = (await hub_call("GET", ""))["jobs"]
        return sum(1 for j in jobs if j.get("notebook") and j.get("state") in mapping.STATES.get(str(query.status), ()))

    async def stop_job(self, job_id: str):
        await hub_call("DELETE", f"/{self._hub_id(job_id)}")

    async def update_job(self, job_id: str, model):
        raise SchedulerError("A job on the hub cannot be renamed or changed; stop it and create another")

    async def delete_job(self, job_id: str):
        job = await hub_call("GET", f"/{self._hub_id(job_id)}")
        if job["state"] in ("queued", "starting", "running"):
            await hub_call("DELETE", f"/{job['id']}")
            return
        raise SchedulerError("The hub keeps its record of every job (it is the accounting record); "
                             "its output notebook stays in your home until you delete it")

    # -- job definitions: the hub's schedules ------------------------------------------------
    async def create_job_definition(self, model) -> str:
        try:
            body = mapping.job_definition(model.dict(), self.root_dir, self.home)
        except mapping.MappingError as exc:
            raise SchedulerError(str(exc)) from None
        made = await hub_call("POST", "", body, api="schedules")
        return mapping.schedule_id(made["id"])

    async def get_job_definition(self, job_definition_id: str) -> DescribeJobDefinition:
        found = await hub_call("GET", f"/{self._hub_id(job_definition_id, mapping.SCHEDULE_PREFIX)}", api="schedules")
        return DescribeJobDefinition(**mapping.describe_definition(found, self.root_dir, self.home))

    async def list_job_definitions(self, query) -> ListJobDefinitionsResponse:
        found = (await hub_call("GET", "", api="schedules"))["schedules"]
        described = [DescribeJobDefinition(**mapping.describe_definition(s, self.root_dir, self.home))
                     for s in found if s.get("notebook")]
        if query.name:
            described = [d for d in described if query.name.lower() in d.name.lower()]
        return ListJobDefinitionsResponse(job_definitions=described, total_count=len(described))

    async def update_job_definition(self, job_definition_id: str, model):
        try:
            active = mapping.definition_update(model.dict(exclude_unset=True))
        except mapping.MappingError as exc:
            raise SchedulerError(str(exc)) from None
        if active is not None:
            number = self._hub_id(job_definition_id, mapping.SCHEDULE_PREFIX)
            await hub_call("POST", f"/{number}/{'resume' if active else 'pause'}", {}, api="schedules")

    async def delete_job_definition(self, job_definition_id: str):
        await hub_call("DELETE", f"/{self._hub_id(job_definition_id, mapping.SCHEDULE_PREFIX)}", api="schedules")

    async def create_job_from_definition(self, job_definition_id: str, model) -> str:
        found = await hub_call("GET", f"/{self._hub_id(job_definition_id, mapping.SCHEDULE_PREFIX)}", api="schedules")
        body = {"profile": found["profile"], "notebook": found["notebook"]}
        parameters = dict(found.get("parameters") or {})
        parameters.update({k: mapping.parameter_value(v) for k, v in ((model and model.parameters) or {}).items()})
        if parameters:
            body["parameters"] = parameters
        job = await hub_call("POST", "", body)
        return mapping.job_id(job["id"])

    def get_staging_paths(self, model):
        # The outputs are written straight into the home; there is no staging area to copy from.
        return {}

    def _hub_id(self, scheduler_id: str, prefix: str = mapping.JOB_PREFIX) -> int:
        try:
            return mapping.hub_id(scheduler_id, prefix)
        except mapping.MappingError as exc:
            raise SchedulerError(str(exc)) from None
