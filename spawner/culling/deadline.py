"""When an idle server is culled: the one rule the culler applies and the pages and APIs show.

A server's idle limit is its profile's (`idle_timeout`), else the hub's GPU or
CPU timeout; while a request waits for GPUs on a GPU server's host, the GPU
limit shortens to the contended timeout (GPUHUB_CULL_TIMEOUT_GPU_CONTENDED),
and goes back when nobody waits.  A profile's `max_age` ends a server that old
whatever its activity.  `deadline` turns that into the moment a server is
culled if it stays idle; the culler (culling/policy.py: GPUCullPolicy), the pool page
and api/wait (poolpage/insight.py) and the in-lab view all call it, so what a
user is shown is what is applied.  Pure: no hub, no ledger, no culler.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta


@dataclass(frozen=True)
class CullRules:
    """The hub's idle limits, in seconds (0: that limit is off)."""

    cpu_timeout: float
    gpu_timeout: float
    gpu_contended_timeout: float = 0.0
    profile_idle: Mapping[str, float] = field(default_factory=dict)  # profile slug -> idle limit
    profile_max_age: Mapping[str, float] = field(default_factory=dict)  # profile slug -> most seconds running

    def to_json(self) -> str:
        """For the culler's command line and the pool service's environment."""
        return json.dumps({"cpu": self.cpu_timeout, "gpu": self.gpu_timeout, "contended": self.gpu_contended_timeout,
                           "idle": dict(self.profile_idle), "max_age": dict(self.profile_max_age)})

    @classmethod
    def from_json(cls, raw: str) -> CullRules:
        d = json.loads(raw)
        return cls(float(d["cpu"]), float(d["gpu"]), float(d.get("contended", 0)),
                   {k: float(v) for k, v in d.get("idle", {}).items()},
                   {k: float(v) for k, v in d.get("max_age", {}).items()})

    @property
    def shortest(self) -> float:
        """The shortest idle limit any server can get (the culler's and activity reports' pace)."""
        limits = [self.cpu_timeout, self.gpu_timeout, self.gpu_contended_timeout, *self.profile_idle.values()]
        return min(x for x in limits if x > 0)


@dataclass(frozen=True)
class Deadline:
    """When a server is culled if it stays idle, and why then."""

    at: datetime | None  # None: never (no activity known yet and no max age)
    idle_limit: float  # seconds of inactivity allowed now
    reason: str  # "idle limit 15 min while requests wait for GPUs", "maximum age 8 h"
    contended: bool = False
    by_max_age: bool = False


def idle_rule(rules: CullRules, is_gpu: bool, profile: str | None, contended: bool) -> tuple[float, str]:
    """(seconds of inactivity allowed, what sets it) for one server."""
    if profile and profile in rules.profile_idle:
        limit, source = rules.profile_idle[profile], f"profile {profile}'s idle limit"
    elif is_gpu:
        limit, source = rules.gpu_timeout, "the GPU servers' idle limit"
    else:
        limit, source = rules.cpu_timeout, "the idle limit"
    if is_gpu and contended and 0 < rules.gpu_contended_timeout < limit:
        limit, source = rules.gpu_contended_timeout, "the idle limit while requests wait for GPUs"
    return limit, source


def deadline(rules: CullRules, *, last_activity: datetime | None, started: datetime | None, is_gpu: bool,
             profile: str | None, contended: bool) -> Deadline:
    """When the server is culled if nothing happens in it (the culler culls at or after it)."""
    limit, source = idle_rule(rules, is_gpu, profile, contended)
    idle_at = (last_activity or started)
    at = idle_at + timedelta(seconds=limit) if idle_at is not None and limit > 0 else None
    reason = f"{source}, {_minutes(limit)}"
    max_age = rules.profile_max_age.get(profile or "", 0.0)
    by_age = False
    if max_age > 0 and started is not None:
        end = started + timedelta(seconds=max_age)
        if at is None or end < at:
            at, reason, by_age = end, f"profile {profile}'s maximum age, {_minutes(max_age)}", True
    return Deadline(at, limit, reason, contended and is_gpu and limit == rules.gpu_contended_timeout, by_age)


def contended(host: str | None, waiting_hosts: Iterable[tuple[str, ...] | None]) -> bool:
    """Whether a request waits for GPUs a server on `host` holds (one for any host, or for this one)."""
    return any(hosts is None or host in hosts for hosts in waiting_hosts)


def _minutes(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
