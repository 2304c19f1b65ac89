"""Per-user job limits: how many of a user's jobs run and wait at once, and their CPUs.

`JobLimits` holds the options (`c.JobLimits.*` in the hub's config; the hub passes
them to the gpu-pool service, which runs the jobs).  The checks are pure: the
runner hands them what the user has, they answer with a refusal (BadJob, 429 or
403) or with why a job has to wait.  Nothing here reads the ledger or Docker.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from traitlets import Dict, Float, Int, TraitError, validate
from traitlets.config import Configurable

from ..profiles import Profile
from .request import BadJob

PROFILE_LIMIT_KEYS = ("running", "queued")
CANCEL_HINT = "cancel one (`gpu-job cancel ID`, or DELETE api/jobs/ID) or wait for one to end"


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _cpus(n: float) -> str:
    return f"{n:g} CPU" if n == 1 else f"{n:g} CPUs"


class JobLimits(Configurable):
    """What one user's batch jobs may take at once (see the module docstring)."""

    max_running = Int(
        4,
        config=True,
        help="""Most jobs one user may have running at once on this host, of every profile together.

        A job counts from the moment it may take its GPUs (while it waits for
        them in the pool's queue it holds its place here) until its container
        is gone.  Further jobs are accepted but wait, in the state `queued`,
        with a message saying what they wait for, and start in submission order
        as the user's earlier jobs end.  0 stops new jobs from starting.
        """,
    )

    max_queued = Int(
        20,
        config=True,
        help="""Most jobs one user may have waiting at once (state `queued`: for GPUs, for CPUs or
        for a running place).

        A submission beyond it is refused with HTTP 429 and a message that
        says the limit and how many jobs the user has queued and running;
        nothing is recorded for it.  Counted over the whole ledger, so it also
        bounds what one user can write into it.  A new job counts as queued
        until it starts, so 0 refuses every submission.
        """,
    )

    max_cpus = Float(
        16.0,
        allow_none=True,
        config=True,
        help="""Most CPUs one user's running jobs may use together on this host (the CPU quota).

        Each job counts its profile's `cpu_limit`; a profile without one counts
        as every CPU of the host.  GPU and CPU jobs count alike (the default
        lets `max_running` jobs of the default 4-CPU GPU profile run at once).  A job that
        does not fit waits, queued, until the user's running jobs leave room; a
        job whose profile alone asks for more than this is refused at once
        with HTTP 403.  None: no CPU quota.
        """,
    )

    max_workers = Int(
        4,
        config=True,
        help="""Most containers (workers) one cluster job may ask for (`"workers": N`,
        `gpu-job submit --workers N`).

        A cluster's workers each get the profile's GPUs, CPUs and memory, and
        are granted together or not at all, so N also bounds what one
        submission holds at once: N x the profile's GPUs, and N x its CPUs
        toward `max_cpus`.  A submission above it is refused with HTTP 400
        naming this limit.  1 turns clusters off.
        """,
    )

    max_parameters_bytes = Int(
        16 * 1024,
        config=True,
        help="""Most bytes a notebook job's parameters may take, written as JSON (`"parameters":
        {...}`, `gpu-job submit --notebook NB -p NAME VALUE`); a schedule's too.

        Papermill injects them into the notebook's first cell, so they are kept
        small: names and values such as epochs or a data path, not data.  A
        submission above it is refused with HTTP 400 naming this limit.
        """,
    )

    profile_limits = Dict(
        config=True,
        help="""Caps of one profile's jobs per user, on top of `max_running` and `max_queued`:
        {profile slug: {"running": n, "queued": m}} (either key may be left out).

        For example `{"tf-gpu-2": {"running": 1, "queued": 2}}`: each user
        runs at most one 2-GPU job at a time and queues at most two more.  A
        submission beyond a profile's `queued` cap is refused with HTTP 429.
        """,
    )

    @validate("max_workers")
    def _check_workers(self, proposal):
        if proposal.value < 1:
            raise TraitError("JobLimits.max_workers must be >= 1 (1: no cluster jobs)")
        return proposal.value

    @validate("max_parameters_bytes")
    def _check_parameters(self, proposal):
        if proposal.value < 2:
            raise TraitError("JobLimits.max_parameters_bytes must be >= 2 (an empty JSON object)")
        return proposal.value

    @validate("max_running", "max_queued")
    def _check_count(self, proposal):
        if proposal.value < 0:
            raise TraitError(f"JobLimits.{proposal.trait.name} must be >= 0")
        return proposal.value

    @validate("max_cpus")
    def _check_cpus(self, proposal):
        if proposal.value is not None and not proposal.value > 0:
            raise TraitError("JobLimits.max_cpus must be > 0, or None for no CPU quota")
        return proposal.value

    @validate("profile_limits")
    def _check_profile_limits(self, proposal):
        for slug, caps in proposal.value.items():
            if not isinstance(caps, dict) or set(caps) - set(PROFILE_LIMIT_KEYS):
                raise TraitError(f"JobLimits.profile_limits[{slug!r}] must be a dict with the keys "
                                 f"{' and/or '.join(PROFILE_LIMIT_KEYS)}, not {caps!r}")
            for key, value in caps.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise TraitError(f"JobLimits.profile_limits[{slug!r}][{key!r}] must be an int >= 0, "
                                     f"not {value!r}")
        return proposal.value

    # ------------------------------------------------------------ pure checks

    def profile_cap(self, slug: str, key: str) -> int | None:
        return self.profile_limits.get(slug, {}).get(key)

    @staticmethod
    def job_cpus(profile: Profile, host_cpus: int | None = None, workers: int = 1) -> float:
        """The CPUs a job of `profile` (of `workers` containers) counts toward the quota."""
        return (profile.cpu_limit or float(host_cpus or os.cpu_count() or 1)) * workers

    def check_submission(self, profile: Profile, active: Iterable[tuple[str, str]], workers: int = 1) -> None:
        """Refuse (BadJob 429/403) a new job of `profile` (a cluster of `workers`) for a user whose
        active jobs are `active`: (profile slug, state) pairs, state 'queued' or holding."""
        active = list(active)
        cpus = self.job_cpus(profile, workers=workers)
        if self.max_cpus is not None and cpus > self.max_cpus:
            what = f"Profile {profile.slug}'s jobs use" if workers == 1 else \
                f"{workers} workers of profile {profile.slug} use"
            raise BadJob(f"{what} {_cpus(cpus)}, but one user's jobs may use at most "
                         f"{_cpus(self.max_cpus)} at once (JobLimits.max_cpus); choose a smaller profile"
                         f"{' or fewer workers' if workers > 1 else ''} or ask an administrator", 403)
        queued = [slug for slug, state in active if state == "queued"]
        running = len(active) - len(queued)
        if len(queued) >= self.max_queued:
            raise BadJob(f"You have {_jobs(len(queued))} queued and {running} running; at most "
                         f"{self.max_queued} may wait at once (JobLimits.max_queued). Try again once one has "
                         f"started, or {CANCEL_HINT}.", 429)
        cap = self.profile_cap(profile.slug, "queued")
        mine = queued.count(profile.slug)
        if cap is not None and mine >= cap:
            raise BadJob(f"You have {mine} {profile.slug} {'job' if mine == 1 else 'jobs'} queued; at most {cap} "
                         f"of this profile may wait at once (JobLimits.profile_limits). Try again once one "
                         f"has started, or {CANCEL_HINT}.", 429)

    def wait_reason(self, profile: Profile, running: Iterable[tuple[str, float]], workers: int = 1) -> str | None:
        """Why a job of `profile` (of `workers` containers) may not start now, beside the user's
        running jobs (`running`: (profile slug, CPUs) pairs); None when it may."""
        running = list(running)
        if len(running) >= self.max_running:
            return (f"waiting: you have {_jobs(len(running))} running, the most one user may run at once "
                    f"(JobLimits.max_running is {self.max_running}); it starts when one ends")
        cap = self.profile_cap(profile.slug, "running")
        same = sum(1 for slug, _ in running if slug == profile.slug)
        if cap is not None and same >= cap:
            return (f"waiting: you have {same} {profile.slug} {'job' if same == 1 else 'jobs'} running, the "
                    f"most of this profile one user may run at once (JobLimits.profile_limits); it starts "
                    "when one ends")
        if self.max_cpus is not None:
            used = sum(c for _, c in running)
            wanted = self.job_cpus(profile, workers=workers)
            if used + wanted > self.max_cpus + 1e-9:
                return (f"waiting: your running jobs use {used:g} of your {_cpus(self.max_cpus)} "
                        f"(JobLimits.max_cpus) and this one needs {wanted:g}; it starts when they leave room")
        return None
