"""Jupyter Scheduler's models <-> the hub's jobs and schedules APIs, as plain dicts.

Pure functions (no I/O, no jupyter_scheduler import), so the repository's unit tests check
the mapping without the images' packages:

    create_job      (CreateJob)            -> POST api/jobs body
    job_definition  (CreateJobDefinition)  -> POST api/schedules body
    describe_job    (a job of api/jobs)    -> DescribeJob fields
    describe_definition (a schedule)       -> DescribeJobDefinition fields
    environments    (api/jobs/profiles)    -> RuntimeEnvironment fields, one per profile

Paths: Jupyter Scheduler names a notebook relative to the server's root directory; the hub
relative to the user's home.  Ids: the scheduler's routes take ids with a dash
(`\\w+(?:-\\w+)+`), so job 12 is `gpuhub-job-12` and schedule 3 `gpuhub-schedule-3`.
"""

from __future__ import annotations

import json
import posixpath
import re
from datetime import datetime, timezone
from typing import Any

JOB_PREFIX = "gpuhub-job-"
SCHEDULE_PREFIX = "gpuhub-schedule-"
OUTPUT_FORMATS = {"ipynb": "Notebook", "html": "HTML"}
# The hub's job states -> Jupyter Scheduler's statuses.
STATUSES = {
    "queued": "QUEUED",
    "starting": "IN_PROGRESS",
    "running": "IN_PROGRESS",
    "succeeded": "COMPLETED",
    "failed": "FAILED",
    "timed-out": "FAILED",
    "cancelled": "STOPPED",
}
# What the job list's status filter asks for -> the hub's states.
STATES = {status: sorted(s for s, st in STATUSES.items() if st == status) for status in set(STATUSES.values())}
_ID = re.compile(r"^[0-9]{1,18}$")


class MappingError(ValueError):
    """What the user asked for has no equivalent on the hub; the message says why."""


def job_id(hub_id: int) -> str:
    return f"{JOB_PREFIX}{hub_id}"


def schedule_id(hub_id: int) -> str:
    return f"{SCHEDULE_PREFIX}{hub_id}"


def hub_id(scheduler_id: str, prefix: str) -> int:
    """The hub's number in a scheduler id (`gpuhub-job-12` -> 12); MappingError if it is not one."""
    rest = scheduler_id[len(prefix):] if scheduler_id.startswith(prefix) else ""
    if not _ID.match(rest):
        kind = "job" if prefix == JOB_PREFIX else "job definition"
        raise MappingError(f"No {kind} {scheduler_id[:60]!r} on the hub")
    return int(rest)


def home_path(input_uri: str, root_dir: str, home: str) -> str:
    """A notebook path relative to the server's root directory, made relative to the home.
    One that leaves the home is sent as it is: the hub refuses it and says why."""
    full = posixpath.normpath(posixpath.join(root_dir, input_uri.lstrip("/")))
    home = posixpath.normpath(home)
    if full.startswith(home.rstrip("/") + "/"):
        return posixpath.relpath(full, home)
    return input_uri


def root_path(path: str | None, root_dir: str, home: str) -> str | None:
    """A path relative to the home, made relative to the server's root directory (what
    JupyterLab opens); None when it is outside the root."""
    if not path:
        return None
    full = posixpath.normpath(posixpath.join(home, path))
    root = posixpath.normpath(root_dir)
    if full == root or not full.startswith(root.rstrip("/") + "/"):
        return None
    return posixpath.relpath(full, root)


def parameter_value(text: Any) -> Any:
    """A parameter as papermill reads one (as `gpu-job -p` sends it): the form's text as JSON
    when it parses (5, 0.1, true, "x"), else the text itself."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _notebook_part(model: dict, root_dir: str, home: str) -> dict:
    body: dict = {"profile": profile_of(model.get("runtime_environment_name")),
                  "notebook": home_path(model.get("input_uri") or "", root_dir, home)}
    if model.get("parameters"):
        body["parameters"] = {str(k): parameter_value(v) for k, v in model["parameters"].items()}
    return body


def create_job(model: dict, root_dir: str, home: str) -> dict:
    """The api/jobs body for a CreateJob ("Run now"): the environment chosen is the profile."""
    return _notebook_part(model, root_dir, home)


def job_definition(model: dict, root_dir: str, home: str) -> dict:
    """The api/schedules body for a CreateJobDefinition ("Run on a schedule").  The hub's cron
    strings are in UTC; another time zone is refused (the form offers UTC only)."""
    tz = model.get("timezone")
    if tz and tz.upper() not in ("UTC", "ETC/UTC", "Z", "GMT"):
        raise MappingError(f"Schedules on the hub run in UTC; choose UTC, not {tz[:40]!r}")
    if not model.get("schedule"):
        raise MappingError("A job definition needs a schedule (a cron string, in UTC)")
    body = _notebook_part(model, root_dir, home)
    body["cron"] = model["schedule"]
    if model.get("name"):
        body["name"] = model["name"]
    return body


def millis(stamp: str | None) -> int | None:
    """An ISO time of the hub (UTC) as Jupyter Scheduler's milliseconds since the epoch."""
    if not stamp:
        return None
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


def _stem(path: str) -> str:
    return posixpath.basename(path)[: -len(".ipynb")] if path.endswith(".ipynb") else posixpath.basename(path)


def _described(item: dict, no_notebook: str) -> dict:
    """The fields a job and a schedule describe alike: the input, the profile, the parameters
    (as the form's text)."""
    return {"input_filename": posixpath.basename(item.get("notebook") or "") or no_notebook,
            "runtime_environment_name": item.get("profile") or "",
            "runtime_environment_parameters": {}, "output_formats": list(OUTPUT_FORMATS),
            "parameters": {k: v if isinstance(v, str) else json.dumps(v)
                           for k, v in (item.get("parameters") or {}).items()}}


def describe_job(job: dict, root_dir: str, home: str, page_url: str, exists=lambda path: False) -> dict:
    """DescribeJob's fields for a job of api/jobs.  `exists(root-relative path)` says whether
    an output is there yet (the job files the list links to); `page_url` is the job's page."""
    notebook = job.get("notebook") or ""
    created = millis(job.get("submitted_at")) or 0
    files = []
    for fmt, key in (("ipynb", "output"), ("html", "output_html")):
        path = root_path(job.get(key), root_dir, home)
        files.append({"display_name": OUTPUT_FORMATS[fmt], "file_format": fmt,
                      "file_path": path if path and exists(path) else None})
    input_path = root_path(notebook, root_dir, home)
    files.append({"display_name": "Input", "file_format": "input",
                  "file_path": input_path if input_path and exists(input_path) else None})
    ended = millis(job.get("ended_at"))
    message = job.get("message") or None
    if job.get("queue_position"):
        message = f"Position {job['queue_position']} in the queue" + (f": {message}" if message else "")
    return {
        **_described(job, "job"),
        "job_id": job_id(job["id"]),
        "name": f"{_stem(notebook) or 'job'} (job {job['id']})",
        "job_definition_id": schedule_id(job["schedule_id"]) if job.get("schedule_id") else None,
        "url": page_url,
        "create_time": created,
        "update_time": ended or millis(job.get("started_at")) or created,
        "start_time": millis(job.get("started_at")),
        "end_time": ended,
        "status": STATUSES.get(job.get("state") or "", "FAILED"),
        "status_message": message,
        "job_files": files,
        "downloaded": all(f["file_path"] for f in files),
    }


def describe_definition(schedule: dict, root_dir: str, home: str) -> dict:
    """DescribeJobDefinition's fields for a schedule of api/schedules."""
    created = millis(schedule.get("created_at")) or 0
    return {
        **_described(schedule, "command"),
        "job_definition_id": schedule_id(schedule["id"]),
        "name": schedule.get("name") or f"schedule {schedule['id']}",
        "schedule": schedule.get("cron"),
        "timezone": "UTC",
        "create_time": created,
        "update_time": millis(schedule.get("last_fired_at")) or created,
        "active": not schedule.get("paused"),
    }


def definition_update(model: dict) -> bool | None:
    """What an UpdateJobDefinition asks the hub for: True to resume, False to pause, None for
    nothing.  Anything else (a new cron string, notebook or profile) the hub does not change
    in place: MappingError says to make a new schedule."""
    changed = sorted(k for k, v in model.items()
                     if v is not None and k not in ("active", "output_filename_template", "timezone"))
    if changed:
        raise MappingError(f"A schedule on the hub cannot change its {', '.join(changed)}; delete it and "
                           "create a new one")
    active = model.get("active")
    return None if active is None else bool(active)


def environments(profiles: list[dict]) -> list[dict]:
    """RuntimeEnvironment's fields, one per profile the user may run jobs with.  The form's
    menu shows an environment's name and sends its label, so both are the same text: the
    profile's slug first, then its name, its GPUs and how many are free now (as JupyterLab's
    GPU panel counts them); profile_of() reads the slug back."""
    out = []
    for p in profiles:
        gpus = int(p.get("gpus") or 0)
        detail = p.get("display_name") or p["slug"]
        if gpus:
            detail += f": {gpus} GPU{'s' if gpus > 1 else ''}"
            if p.get("free") is not None:
                detail += f", {p['free']} free"
        else:
            detail += ": no GPU"
        name = f"{p['slug']} ({detail})"
        out.append({"name": name, "label": name,
                    "description": f"Runs on the hub as a job of profile {p['slug']}, in its image",
                    "file_extensions": ["ipynb"], "output_formats": list(OUTPUT_FORMATS),
                    "metadata": {"profile": p["slug"], "gpus": str(gpus)}, "utc_only": True})
    return out


def profile_of(environment: str | None) -> str | None:
    """The profile's slug in an environment's name (`tf-gpu-1 (TensorFlow + 1 GPU: ...)`); a
    bare slug (a REST caller's) as it is."""
    return environment.split(" (", 1)[0] if environment else None
