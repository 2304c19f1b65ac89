"""Spawn profiles: what a user may ask for, and the validation of their ask.

A profile is the only thing a user chooses.  It fixes the image, the number
of GPUs, CPU and memory limits and which groups may use it; nothing in
`user_options` can reach past it (no image, environment, mount or GPU of the
user's own).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tornado import web

# The only key a user may send in user_options (REST or form).
PROFILE_KEY = "profile"

DEFAULT_PROFILES: list[dict[str, Any]] = [
    {
        "slug": "tf-cpu",
        "display_name": "TensorFlow CPU (MKL/oneDNN)",
        "description": "CPU TensorFlow with the oneDNN (MKL) optimisations on. No GPU.",
        "image": "gpuhub/notebook-mkl:latest",
        "gpus": 0,
        "cpu_limit": 2.0,
        "mem_limit": "4G",
        "groups": [],
    },
    {
        "slug": "tf-gpu-1",
        "display_name": "TensorFlow + 1 GPU",
        "description": "TensorFlow with CUDA, one NVIDIA GPU lent to you alone.",
        "image": "gpuhub/notebook-cuda:latest",
        "gpus": 1,
        "cpu_limit": 4.0,
        "mem_limit": "16G",
        "groups": [],
    },
]

_FIELDS = {"slug", "display_name", "description", "image", "gpus", "cpu_limit", "mem_limit", "groups",
           "job_max_seconds", "job_network", "node_labels", "idle_timeout", "max_age", "borrow"}


class ProfileConfigError(ValueError):
    """A profile in the hub's configuration is malformed (an admin's error)."""


@dataclass(frozen=True)
class Profile:
    slug: str
    display_name: str
    image: str
    gpus: int = 0
    cpu_limit: float | None = None
    mem_limit: str | None = None
    groups: tuple[str, ...] = ()
    description: str = ""
    # Batch jobs (spawner/jobs): the longest timeout a job may ask for (None: the
    # hub's GPUHUB_JOB_MAX_SECONDS), and whether its container gets the hub's
    # Docker network (False: no network at all).
    job_max_seconds: int | None = None
    job_network: bool = False
    node_labels: tuple[tuple[str, str], ...] = ()
    """Swarm node labels the GPUs must come from, e.g. (("gpu.model", "a100"),)."""
    # Culling (spawner/culling/deadline.py): seconds of inactivity before this profile's servers
    # are culled (None: the hub's GPU or CPU timeout), and the most seconds one may run at all.
    idle_timeout: int | None = None
    max_age: int | None = None
    # Borrowing (pool/leasing/reclaim.py): a server of this profile may take idle GPUs beyond its
    # user's share (a borrowed lease, reclaimed with GPUPool.reclaim_grace's notice).
    borrow: bool = False

    def allows(self, user_groups: Iterable[str]) -> bool:
        """An empty group list means everyone may use the profile."""
        return not self.groups or bool(set(self.groups) & set(user_groups))

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> Profile:
        if not isinstance(raw, dict):
            raise ProfileConfigError(f"a profile must be a dict, not {type(raw).__name__}")
        unknown = set(raw) - _FIELDS
        if unknown:
            raise ProfileConfigError(f"profile {raw.get('slug')!r}: unknown keys {sorted(unknown)}")
        for key in ("slug", "display_name", "image"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise ProfileConfigError(f"profile {raw.get('slug')!r}: {key!r} must be a non-empty string")
        gpus = raw.get("gpus", 0)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'gpus' must be an integer >= 0")
        cpu = raw.get("cpu_limit")
        if cpu is not None and (not isinstance(cpu, (int, float)) or isinstance(cpu, bool) or cpu <= 0):
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'cpu_limit' must be a positive number")
        groups = raw.get("groups") or []
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, str) for g in groups):
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'groups' must be a list of group names")
        job_max = raw.get("job_max_seconds")
        if job_max is not None and (not isinstance(job_max, int) or isinstance(job_max, bool) or job_max <= 0):
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'job_max_seconds' must be a positive integer")
        for key in ("idle_timeout", "max_age"):
            value = raw.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ProfileConfigError(f"profile {raw['slug']!r}: {key!r} must be a positive number of seconds")
        if not isinstance(raw.get("borrow", cls.borrow), bool):
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'borrow' must be true or false")
        if not isinstance(raw.get("job_network", False), bool):
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'job_network' must be true or false")
        labels = raw.get("node_labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in labels.items()):
            raise ProfileConfigError(f"profile {raw['slug']!r}: 'node_labels' must map label names to "
                                     "values, like {\"gpu.model\": \"a100\"}")
        return cls(
            job_max_seconds=job_max,
            job_network=raw.get("job_network", False),
            slug=raw["slug"],
            display_name=raw["display_name"],
            image=raw["image"],
            gpus=gpus,
            cpu_limit=float(cpu) if cpu is not None else None,
            mem_limit=raw.get("mem_limit"),
            groups=tuple(groups),
            description=raw.get("description", ""),
            node_labels=tuple(sorted(labels.items())),
            idle_timeout=raw.get("idle_timeout"),
            max_age=raw.get("max_age"),
            borrow=raw.get("borrow", cls.borrow),
        )


def load_profiles(raw_profiles: list[dict[str, Any]]) -> list[Profile]:
    profiles = [Profile.from_config(p) for p in raw_profiles]
    if not profiles:
        raise ProfileConfigError("no profiles are configured")
    slugs = [p.slug for p in profiles]
    duplicates = sorted({s for s in slugs if slugs.count(s) > 1})
    if duplicates:
        raise ProfileConfigError(f"duplicate profile slugs: {duplicates}")
    return profiles


def choose_profile(user_options: Any, profiles: list[Profile], user_groups: Iterable[str],
                   default_slug: str = "") -> Profile:
    """Validate `user_options` and return the profile it selects.

    Raises tornado HTTPError 400 for malformed options and 403 for a profile
    the user's groups do not allow.  Messages are shown to the user as-is.
    """
    if user_options is None:
        user_options = {}
    if not isinstance(user_options, dict):
        raise web.HTTPError(400, "user_options must be a JSON object such as {\"profile\": \"tf-cpu\"}")
    extra = sorted(str(k) for k in user_options if k != PROFILE_KEY)
    if extra:
        raise web.HTTPError(
            400,
            f"Unsupported option(s) {', '.join(repr(k) for k in extra)}: only 'profile' may be chosen; "
            "the image, environment, mounts and GPUs come from the profile.",
        )
    groups = set(user_groups)
    allowed = [p for p in profiles if p.allows(groups)]
    slug = user_options.get(PROFILE_KEY)
    if slug is None:
        if not allowed:
            raise web.HTTPError(403, "No profile is available to you; ask an administrator for access.")
        by_slug = {p.slug: p for p in allowed}
        return by_slug.get(default_slug, allowed[0])
    if not isinstance(slug, str):
        raise web.HTTPError(400, f"'profile' must be a string (a profile slug), not {type(slug).__name__}")
    known = {p.slug: p for p in profiles}
    if slug not in known:
        # Never echo more than a short, printable prefix of hostile input.
        shown = "".join(ch for ch in slug[:40] if ch.isprintable())
        raise web.HTTPError(
            400, f"Unknown profile {shown!r}. Choose one of: {', '.join(p.slug for p in allowed) or 'none'}."
        )
    profile = known[slug]
    if not profile.allows(groups):
        raise web.HTTPError(
            403, f"Profile {profile.slug!r} is for members of {', '.join(profile.groups)}; you are not one."
        )
    return profile


def options_form_html(allowed: list[Profile], default_slug: str, counts: dict | None,
                      per_profile: dict[str, dict] | None = None) -> str:
    """The spawn form: the profiles a user may choose, each GPU one with how many GPUs are
    free now (`counts` from the pool; None when the ledger did not answer).  `per_profile`
    (slug -> counts) overrides them for profiles limited to some hosts (node labels)."""
    from html import escape

    if not allowed:
        return "<p>No profile is available to you; ask an administrator for access.</p>"
    default = default_slug or allowed[0].slug
    rows = []
    for profile in allowed:
        mine = (per_profile or {}).get(profile.slug, counts)
        if mine is None:
            free = total = None
        else:
            free = mine.get("free", 0)
            total = free + mine.get("lent", 0)
        if profile.gpus == 0:
            availability = "no GPU"
        elif free is None:
            availability = f"{profile.gpus} GPU(s); availability unknown right now"
        else:
            availability = f"{profile.gpus} GPU(s); {free} of {total} free now"
        if profile.gpus and profile.borrow:
            availability += "; may borrow idle GPUs beyond your share"
        checked = " checked" if profile.slug == default else ""
        rows.append(
            f'<div class="radio"><label>'
            f'<input type="radio" name="profile" value="{escape(profile.slug)}"{checked}> '
            f"<strong>{escape(profile.display_name)}</strong> "
            f'<span class="gpu-availability">({escape(availability)})</span>'
            f'<br><small>{escape(profile.description)}</small></label></div>'
        )
    return "\n".join(rows)
