"""The idle culler in the hub's config: its service, its role, and what the servers report.

Called by apply_settings when GPUHUB_CULL is on (the default).  The culler itself is
spawner/culling/culler.py; this is only what the hub's configuration says about it.
"""

from __future__ import annotations

import sys

from ..culling.culler import BUSY_SWITCH_ENV, QUIET_ENV, SERVICE_NAME
from ..culling.deadline import CullRules
from ..profiles import load_profiles
from .hub import default_profiles
from .part import Part


def rules_from_settings(settings) -> CullRules:
    """The culler's rules (culling/deadline.py) from the hub's settings and profiles."""
    profiles = load_profiles(getattr(settings, "profiles", None) or default_profiles(settings))
    return CullRules(settings.cull_timeout_cpu, settings.cull_timeout_gpu,
                     getattr(settings, "cull_timeout_gpu_contended", 0),
                     {p.slug: float(p.idle_timeout) for p in profiles if p.idle_timeout},
                     {p.slug: float(p.max_age) for p in profiles if p.max_age})


# The culler's role: only what it uses.
CULLER_SCOPES = [
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    "admin:server_state",
]


def activity_interval(settings) -> int:
    """Seconds between a single-user server's activity reports to the hub.

    A busy kernel is seen only at these reports, so they must come well
    inside the shortest idle timeout: a third of it, at most 300 s
    (JupyterHub's default).
    """
    configured = getattr(settings, "activity_interval", 0)
    if configured:
        return configured
    shortest = int(rules_from_settings(settings).shortest)  # the contended and profiles' limits too
    return max(1, min(300, shortest // 3))


def quiet_after(settings) -> int:
    """Seconds of quiet after which a server posts its next activity to the hub at once.

    Work that starts again after a quiet spell would otherwise reach the hub only at the
    next periodic report, up to `activity_interval` later, and a cull pass in between stops
    a busy server.  A third of the shortest idle limit: a server quiet for less is still far
    from any deadline, so continuous work adds no requests.
    """
    return max(1, int(rules_from_settings(settings).shortest) // 3)


def culler_command(settings, python: str | None = None) -> list[str]:
    cmd = [
        python or sys.executable, "-m", "spawner.culling",
        f"--cpu-timeout={settings.cull_timeout_cpu}",
        f"--gpu-timeout={settings.cull_timeout_gpu}",
        f"--gpu-contended-timeout={getattr(settings, 'cull_timeout_gpu_contended', 0)}",
        f"--timeout={int(rules_from_settings(settings).shortest)}",
        f"--cull-every={settings.cull_every}",
        f"--inventory={settings.inventory}",
    ]
    # Always explicit: the culler's own default depends on its inventory.
    cmd.append(f"--gpu-idle-percent={settings.gpu_idle_percent:g}")
    if settings.gpu_idle_percent > 0:
        cmd.append(f"--gpu-idle-seconds={settings.gpu_idle_minutes * 60:g}")
        if settings.inventory == "simulated":
            if settings.simulated_gpus is not None:  # else the culler's default, SimulatedInventory's
                cmd.append(f"--simulated-gpus={settings.simulated_gpus}")
            if settings.simulated_utilization_file:
                cmd.append(f"--utilization-file={settings.simulated_utilization_file}")
    rules = rules_from_settings(settings)
    if rules.profile_idle or rules.profile_max_age:
        cmd.append(f"--profile-limits={rules.to_json()}")
    return cmd


def culler_part(settings) -> Part:
    """The culler's service and its role, of only the scopes it uses, and what the servers report."""
    from ..pool import ENV_DB_URL

    interval = activity_interval(settings)
    quiet = quiet_after(settings)
    keep_busy = getattr(settings, "cull_keep_busy", "extension")
    # The culler records its intent in the ledger before each cull, and on Swarm reads the
    # agents' readings there, and who waits (the contended timeout), the budgets and the
    # bookings; the URL in the environment, not argv (ps shows argv).
    return Part(
        services=({"name": SERVICE_NAME, "command": culler_command(settings),
                   "environment": {ENV_DB_URL: settings.pool_db_url}},),
        roles=({"name": SERVICE_NAME,
                "description": "Stop idle servers (GPU servers sooner) and give their GPUs back",
                "scopes": list(CULLER_SCOPES),
                "services": [SERVICE_NAME]},),
        environment={"JUPYTERHUB_ACTIVITY_INTERVAL": str(interval),
                     # Read by the images' gpuhub_activity extension: work after a quiet spell this
                     # long reaches the hub at once.
                     QUIET_ENV: str(quiet),
                     # Read by the images' gpuhub_activity extension.
                     BUSY_SWITCH_ENV: "0" if keep_busy == "off" else "1"},
    )


def configure_culler(c, settings) -> None:
    """The culler's options of the hub itself (called by apply_settings); its service, role and
    the servers' environment are its `culler_part` (services.py sets them)."""
    # The hub drops activity reports closer than activity_resolution to the
    # last one; keep it finer than the reports, or busy kernels stop counting,
    # and than the quiet spell, or the post that ends one is dropped.
    c.JupyterHub.activity_resolution = max(1, min(30, activity_interval(settings), quiet_after(settings)))
