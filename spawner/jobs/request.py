"""What a job submission may contain, checked before anything is leased or created.

Only `profile`, `command` (a list of strings) or `notebook` (a notebook in the home, run
with papermill, with its `parameters`: notebook.py), `workdir` (relative, inside the
home), `timeout` (seconds, within the profile's maximum), `workers` (a
cluster of that many containers, each with the profile's GPUs; within
JobLimits.max_workers), `borrow` (true: it may run on idle GPUs beyond its user's
share, reclaimed with notice; false by default) and `requeue` (false: a
reclaimed run is not queued again; true by default).  Anything else is
refused with a message (HTTP 400): a user never picks an image, environment,
mount or GPU.  Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..profiles import Profile, choose_profile
from . import notebook as nb
from .refusal import MAX_PATH, BadJob, shown

ALLOWED_KEYS = ("profile", "command", "notebook", "parameters", "workdir", "timeout", "workers", "borrow", "requeue")
MAX_ARGS = 256
MAX_COMMAND_BYTES = 16 * 1024


@dataclass(frozen=True)
class Submission:
    profile: Profile
    command: tuple[str, ...]
    workdir: str
    timeout_s: int
    workers: int = 1  # > 1: a cluster job (one container per worker, TF_CONFIG naming them all)
    borrow: bool = False  # may run on idle GPUs beyond the user's share (borrowed, reclaimed with notice)
    requeue: bool = True  # a reclaimed run goes back to the queue by itself
    # A notebook job: the notebook's path in the home ("" for a command) and papermill's parameters.
    notebook: str = ""
    parameters: dict | None = None


def check_workdir(value: Any) -> str:
    """A path relative to the home, without `..`; "" is the home itself."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadJob(f"'workdir' must be a string (a directory in your home), not {type(value).__name__}")
    if len(value) > MAX_PATH or any(ord(ch) < 32 for ch in value):
        raise BadJob("'workdir' is too long or contains control characters")
    if value.startswith("/") or value.startswith("~"):
        raise BadJob(f"'workdir' must be relative to your home, not {shown(value)!r}")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadJob("'workdir' must stay inside your home ('..' is not allowed)")
    return "/".join(parts)


def check_command(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise BadJob("'command' must be a non-empty list of strings, e.g. [\"python\", \"train.py\"]")
    if len(value) > MAX_ARGS:
        raise BadJob(f"'command' has {len(value)} arguments; at most {MAX_ARGS} are allowed")
    if not all(isinstance(arg, str) for arg in value):
        raise BadJob("every item of 'command' must be a string")
    if any("\0" in arg for arg in value):
        raise BadJob("'command' must not contain NUL characters")
    size = sum(len(arg.encode()) for arg in value)
    if size > MAX_COMMAND_BYTES:
        raise BadJob(f"'command' is {size} bytes long; at most {MAX_COMMAND_BYTES} are allowed")
    if not value[0]:
        raise BadJob("'command' must start with the program to run")
    return tuple(value)


def max_seconds(profile: Profile, default_max: int) -> int:
    return profile.job_max_seconds or default_max


def check_timeout(value: Any, limit: int) -> int:
    if value is None:
        return limit
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise BadJob(f"'timeout' must be a number of seconds, not {shown(value)!r}")
    if value < 1 or value > limit:
        raise BadJob(f"'timeout' must be between 1 and {limit} seconds (this profile's maximum)")
    return int(value)


def check_workers(value: Any, limit: int) -> int:
    """1 (a plain job) when absent; else a whole number from 1 to `limit` (JobLimits.max_workers)."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadJob(f"'workers' must be a whole number of containers, not {shown(value)!r}")
    if not 1 <= value <= limit:
        raise BadJob(f"'workers' must be between 1 and {limit} (JobLimits.max_workers), not {shown(value)}")
    return value


def check_flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadJob(f"'{key}' must be true or false, not {shown(value)!r}")
    return value


def check_submission(body: Any, profiles: list[Profile], user_groups, default_max: int,
                     max_workers: int = 1, max_parameters_bytes: int | None = None) -> Submission:
    """The submission in `body` (parsed JSON), or BadJob (400; 403 for a profile not theirs).

    `max_workers` is JobLimits.max_workers (1: clusters refused); `max_parameters_bytes`
    JobLimits.max_parameters_bytes (a notebook's parameters as JSON; None: the command's own bound)."""
    if not isinstance(body, dict):
        raise BadJob('The body must be a JSON object such as '
                     '{"profile": "tf-gpu-1", "command": ["python", "train.py"]}')
    extra = sorted(shown(k) for k in body if k not in ALLOWED_KEYS)
    if extra:
        raise BadJob(f"Unsupported field(s) {', '.join(repr(k) for k in extra)}: a job takes only "
                     f"{', '.join(ALLOWED_KEYS)}; the image, environment, mounts and GPUs come "
                     "from the profile.")
    if "profile" not in body:
        raise BadJob("'profile' is required (the slug of a profile, e.g. tf-gpu-1)")
    from tornado import web

    try:
        profile = choose_profile({"profile": body["profile"]}, profiles, user_groups)
    except web.HTTPError as exc:
        raise BadJob(exc.log_message or str(exc), exc.status_code) from None
    timeout_s = check_timeout(body.get("timeout"), max_seconds(profile, default_max))
    workers = check_workers(body.get("workers"), max_workers)
    borrow, requeue = check_flag(body, "borrow", False), check_flag(body, "requeue", True)
    if body.get("notebook") is None:
        if body.get("parameters") is not None:
            raise BadJob("'parameters' are for a notebook job: give 'notebook' too")
        return Submission(profile=profile, command=check_command(body.get("command")),
                          workdir=check_workdir(body.get("workdir")), timeout_s=timeout_s, workers=workers,
                          borrow=borrow, requeue=requeue)
    if body.get("command") is not None or body.get("workdir") is not None:
        raise BadJob("A job runs either a 'command' or a 'notebook', not both; a notebook runs in its "
                     "own directory, so it takes no 'workdir'")
    if workers != 1:
        raise BadJob("A notebook job runs in one container; 'workers' is for command jobs")
    if max_parameters_bytes is None:  # bounded still: they become part of the command
        max_parameters_bytes = MAX_COMMAND_BYTES
    path = nb.check_notebook(body["notebook"])
    parameters = nb.check_parameters(body.get("parameters"), max_parameters_bytes)
    return Submission(profile=profile, command=nb.command(path, parameters), workdir=nb.workdir_of(path),
                      timeout_s=timeout_s, notebook=path, parameters=parameters, borrow=borrow, requeue=requeue)
