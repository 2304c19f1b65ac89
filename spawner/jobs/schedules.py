"""Schedules: a job (a command or a notebook) fired by the gpu-pool service on a cron string.

`ScheduleLimits` holds the options (`c.ScheduleLimits.*` in the hub's config; the hub passes
them to the service, which keeps and fires the schedules).  `check_schedule` checks what a
user asks for (pure, given the clock): the cron string (cron.py), the shortest interval,
the job itself (request.py, as the jobs API checks it) and the longest run.  The scheduler
(scheduler.py) fires them; their records are pool/ledger/schedule_records.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from traitlets import Int, TraitError, validate
from traitlets.config import Configurable

from ..profiles import Profile
from . import cron
from .request import BadJob, Submission, check_submission, shown

SCHEDULE_KEYS = ("cron", "name", "profile", "command", "notebook", "parameters", "workdir", "timeout")
MAX_NAME = 100


class ScheduleLimits(Configurable):
    """What one user's schedules may ask for (see the module docstring)."""

    max_per_user = Int(
        10,
        config=True,
        help="""Most schedules one user may keep (active and paused together).

        A new one beyond it is refused with HTTP 429 naming this limit; the
        user deletes one first.  0 turns schedules off for everyone.
        """,
    )

    min_interval_minutes = Int(
        15,
        config=True,
        help="""The shortest time, in minutes, between two firings of one schedule.

        A cron string that would fire more often (`* * * * *`, `*/5 * * * *`,
        or two slots closer than this anywhere in its next 200 firings) is
        refused with HTTP 400 naming this limit.  Each firing is a job that
        queues for GPUs like any other; this keeps a schedule from filling the
        queue.
        """,
    )

    max_run_seconds = Int(
        6 * 3600,
        config=True,
        help="""The longest a scheduled job may run, in seconds (its `timeout`).

        A schedule without a timeout gets the shorter of this and its profile's
        job maximum; one asking for more is refused with HTTP 400 naming this
        limit.  A firing's job is stopped (timed-out) after it, like any job.
        """,
    )

    @validate("max_per_user")
    def _check_count(self, proposal):
        if proposal.value < 0:
            raise TraitError("ScheduleLimits.max_per_user must be >= 0 (0: no schedules)")
        return proposal.value

    @validate("min_interval_minutes", "max_run_seconds")
    def _check_positive(self, proposal):
        if proposal.value < 1:
            raise TraitError(f"ScheduleLimits.{proposal.trait.name} must be >= 1")
        return proposal.value

    def check_count(self, have: int) -> None:
        """Refuse (429) a new schedule for a user who has `have`."""
        if have >= self.max_per_user:
            raise BadJob(f"You have {have} schedule{'s' if have != 1 else ''}; at most {self.max_per_user} "
                         "are allowed per user (ScheduleLimits.max_per_user). Delete one first "
                         "(`gpu-job schedule delete ID`, or DELETE api/schedules/ID).", 429)


@dataclass(frozen=True)
class ScheduleRequest:
    cron: str
    name: str
    body: dict  # the job's submission, kept and checked again at each firing
    submission: Submission


def job_body(body: dict) -> dict:
    """The part of a schedule's body that is the job's submission (what each firing submits)."""
    return {k: v for k, v in body.items() if k not in ("cron", "name") and v is not None}


def check_schedule(body: Any, profiles: list[Profile], groups, default_max: int, limits: ScheduleLimits,
                   now: datetime, max_parameters_bytes: int | None = None) -> ScheduleRequest:
    """The schedule in `body` (parsed JSON), or BadJob (400; 403 for a profile not theirs)."""
    if not isinstance(body, dict):
        raise BadJob('The body must be a JSON object such as {"cron": "0 3 * * *", "profile": "tf-gpu-1", '
                     '"notebook": "train.ipynb"}')
    extra = sorted(shown(k) for k in body if k not in SCHEDULE_KEYS)
    if extra:
        raise BadJob(f"Unsupported field(s) {', '.join(repr(k) for k in extra)}: a schedule takes only "
                     f"{', '.join(SCHEDULE_KEYS)}")
    try:
        expr = cron.check_cron(body.get("cron"), now)
    except cron.BadCron as exc:
        raise BadJob(str(exc)) from None
    gap = cron.shortest_interval(expr, now)
    if gap.total_seconds() < limits.min_interval_minutes * 60:
        raise BadJob(f"'cron' {expr!r} fires every {gap.total_seconds() / 60:g} minute(s) at its most often; "
                     f"schedules may fire at most every {limits.min_interval_minutes} minutes "
                     "(ScheduleLimits.min_interval_minutes)")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME
                             or any(not ch.isprintable() for ch in name)):
        raise BadJob(f"'name' must be a short line of text (at most {MAX_NAME} characters)")
    timeout = body.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > limits.max_run_seconds:
        raise BadJob(f"'timeout' is {timeout:g} s; a scheduled job may run at most {limits.max_run_seconds} s "
                     "(ScheduleLimits.max_run_seconds)")
    job = job_body(body)
    sub = check_submission(job, profiles, groups, default_max, 1, max_parameters_bytes)
    if timeout is None:  # the shorter of the profile's maximum and the schedules' longest run
        job["timeout"] = min(sub.timeout_s, limits.max_run_seconds)
        sub = check_submission(job, profiles, groups, default_max, 1, max_parameters_bytes)
    label = name or sub.notebook or " ".join(sub.command)[:MAX_NAME]
    return ScheduleRequest(cron=expr, name=label, body=job, submission=sub)
