"""The idle culler in the hub's config: its options, its service and role, what the servers report.

Called by apply_settings when GPUHUB_CULL is on (the default).  The culler itself is
spawner/culling/culler.py; this is only what the hub's configuration says about it.

Its options are `c.GPUIdleCuller.*` of the hub's config: each GPUHUB_CULL_* (and the GPU-idle
rule's variables) sets one of them when it is given, and an admin's config file may set any
other.  The hub hands them over as the pool service gets its own: a file of config sections
written from its final config once every config file is loaded (`idle-culler.json` in the data
directory, read by the culler's own `--config`).  What depends on them (how often the servers
report activity, the deadlines the pool page shows) is computed from the same final config.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from traitlets.config import Config

from ..culling.culler import BUSY_SWITCH_ENV, QUIET_ENV, SERVICE_NAME, GPUIdleCuller
from ..culling.deadline import CullRules
from ..profiles import load_profiles
from ..services.lifecycle import write_when_config_loaded
from .part import Part

HAND_OVER = "idle-culler.json"

# GPUHUB_* Settings field -> the one GPUIdleCuller option it sets (only when it is given).
OPTIONS = {
    "cull_timeout_cpu": "cpu_timeout",
    "cull_timeout_gpu": "gpu_timeout",
    "cull_timeout_gpu_contended": "gpu_contended_timeout",
    "cull_every": "cull_every",
    "gpu_idle_percent": "gpu_idle_percent",
}

# The culler's role: only what it uses.
CULLER_SCOPES = [
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    "admin:server_state",
]


def set_culler_options(c, settings) -> None:
    """c.GPUIdleCuller from the GPUHUB_* settings: the given ones only, and the hub's inventory
    (the culler reads GPU utilisation where the hub's spawner finds its GPUs)."""
    section = c.GPUIdleCuller
    section.inventory = settings.inventory
    for field, option in OPTIONS.items():
        value = getattr(settings, field)
        if value is not None:
            section[option] = value
    if settings.gpu_idle_minutes is not None:
        section.gpu_idle_seconds = settings.gpu_idle_minutes * 60
    if settings.inventory == "simulated":
        if settings.simulated_gpus is not None:  # else SimulatedInventory's count, as the hub's
            section.simulated_gpus = settings.simulated_gpus
        if settings.simulated_utilization_file:
            section.utilization_file = settings.simulated_utilization_file


def culler_config(settings) -> Config:
    """A config holding only what the GPUHUB_* settings say of the culler (and the profiles)."""
    c = Config()
    set_culler_options(c, settings)
    if settings.profiles:
        c.GPUDockerSpawner.profiles = settings.profiles
    return c


def _profiles(c) -> list:
    # The hub's own default profiles set no idle limits of their own.
    return list(c.GPUDockerSpawner.get("profiles") or c.GPULendingSpawner.get("profiles") or [])


def culler_options(c) -> GPUIdleCuller:
    """The culler's options as config `c` sets them, with the per-profile limits of `c`'s profiles
    (an instance only read here: nothing is started)."""
    limits = _profile_limits(c)
    section = dict(c.GPUIdleCuller)
    if limits and "profile_limits" not in section:
        section["profile_limits"] = limits
    return GPUIdleCuller(config=Config({"GPUIdleCuller": section}))


def _profile_limits(c) -> str:
    raw = _profiles(c)
    profiles = load_profiles(raw) if raw else []
    idle = {p.slug: float(p.idle_timeout) for p in profiles if p.idle_timeout}
    max_age = {p.slug: float(p.max_age) for p in profiles if p.max_age}
    return CullRules(0, 0, 0, idle, max_age).to_json() if idle or max_age else ""


def rules_from_config(c) -> CullRules:
    """The culler's rules (culling/deadline.py) as config `c` sets them."""
    return culler_options(c).rules()


def activity_interval(c, configured: int = 0) -> int:
    """Seconds between a single-user server's activity reports to the hub.

    A busy kernel is seen only at these reports, so they must come well
    inside the shortest idle timeout: a third of it, at most 300 s
    (JupyterHub's default).  `configured` (GPUHUB_ACTIVITY_INTERVAL) wins when set.
    """
    if configured:
        return configured
    shortest = int(rules_from_config(c).shortest)  # the contended and profiles' limits too
    return max(1, min(300, shortest // 3))


def quiet_after(c) -> int:
    """Seconds of quiet after which a server posts its next activity to the hub at once.

    Work that starts again after a quiet spell would otherwise reach the hub only at the
    next periodic report, up to `activity_interval` later, and a cull pass in between stops
    a busy server.  A third of the shortest idle limit: a server quiet for less is still far
    from any deadline, so continuous work adds no requests.
    """
    return max(1, int(rules_from_config(c).shortest) // 3)


def activity_resolution(c, configured: int = 0) -> int:
    """The hub drops activity reports closer than this to the last one: finer than the reports,
    or busy kernels stop counting, and than the quiet spell, or the post that ends one is dropped."""
    return max(1, min(30, activity_interval(c, configured), quiet_after(c)))


def page_cull_values(c) -> dict:
    """What the pool page shows of the culler (PoolPageSettings' cull_* options), from config `c`."""
    culler = culler_options(c)
    return {"cull_timeout_gpu": culler.gpu_timeout, "cull_timeout_cpu": culler.cpu_timeout,
            "cull_every": culler.cull_every, "cull_rules": culler.rules().to_json(),
            "gpu_idle_percent": float(culler.gpu_idle_percent),
            "gpu_idle_seconds": float(culler.gpu_idle_seconds)}


def render_hand_over(c) -> str:
    """The culler's file: its section of the hub's final config `c`, with the profiles' limits."""
    section = {name: value for name, value in dict(c.GPUIdleCuller).items()
               if name not in ("config_file", "generate_config")}
    limits = _profile_limits(c)
    if limits and "profile_limits" not in section:
        section["profile_limits"] = limits
    return json.dumps({"GPUIdleCuller": section}, sort_keys=True, indent=1)


def culler_command(path, python: str | None = None) -> list[str]:
    """The culler's command line: its settings come from the hub's file, none from argv."""
    return [python or sys.executable, "-m", "spawner.culling", f"--config={path}"]


@dataclass(frozen=True)
class ReportEvery:
    """A server's activity setting, computed at its spawn from the hub's final config (JupyterHub
    calls a callable value of `Spawner.environment` with the spawner): `what` is "interval"
    (JUPYTERHUB_ACTIVITY_INTERVAL; `configured` is GPUHUB_ACTIVITY_INTERVAL) or "quiet"
    (GPUHUB_ACTIVITY_QUIET_AFTER).  A value, so that building the config twice gives equal ones."""

    what: str
    configured: int = 0

    def __call__(self, spawner) -> str:
        if self.what == "interval":
            return str(activity_interval(spawner.config, self.configured))
        return str(quiet_after(spawner.config))

    def __str__(self) -> str:
        return f"<the activity {self.what} from the culler's options>"


def culler_part(settings) -> Part:
    """The culler's service and its role, of only the scopes it uses, and what the servers report."""
    from ..pool import ENV_DB_URL

    keep_busy = getattr(settings, "cull_keep_busy", "extension")
    configured = settings.activity_interval
    # The culler records its intent in the ledger before each cull, and on Swarm reads the
    # agents' readings there, and who waits (the contended timeout), the budgets and the
    # bookings; the URL in the environment, not argv (ps shows argv).
    return Part(
        services=({"name": SERVICE_NAME, "command": culler_command(settings.data_dir / HAND_OVER),
                   "environment": {ENV_DB_URL: settings.pool_db_url}},),
        roles=({"name": SERVICE_NAME,
                "description": "Stop idle servers (GPU servers sooner) and give their GPUs back",
                "scopes": list(CULLER_SCOPES),
                "services": [SERVICE_NAME]},),
        environment={"JUPYTERHUB_ACTIVITY_INTERVAL": ReportEvery("interval", configured),
                     # Read by the images' gpuhub_activity extension: work after a quiet spell this
                     # long reaches the hub at once.
                     QUIET_ENV: ReportEvery("quiet"),
                     # Read by the images' gpuhub_activity extension.
                     BUSY_SWITCH_ENV: "0" if keep_busy == "off" else "1"},
    )


def configure_culler(c, settings) -> None:
    """The culler's options and the hub's own (called by apply_settings); its service, role and
    the servers' environment are its `culler_part` (services.py sets them).  Its file is written
    from the hub's final config, so c.GPUIdleCuller in a later config file counts."""
    set_culler_options(c, settings)
    # From the config so far: the hub reads it before a later config file could be looked at, so
    # a config file that shortens the culler's limits below a minute sets it too (the admins' guide).
    c.JupyterHub.activity_resolution = activity_resolution(c, settings.activity_interval)
    write_when_config_loaded(settings.data_dir / HAND_OVER, lambda hub: render_hand_over(hub.config))
