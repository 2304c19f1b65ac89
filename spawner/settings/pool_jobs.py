"""Batch jobs in the hub's config: the `custom:gpu-jobs` scope, who holds it, and what the
gpu-pool service (which runs the jobs) and the notebook servers (which submit them) need.

Called by apply_settings with GPUHUB_JOBS; its part of the service and roles is `jobs_part`.
"""

from __future__ import annotations

import socket
from dataclasses import asdict

from ..engines import engine
from ..engines.common.containers import ContainerLimits
from ..jobs import JOBS_SCOPE
from ..jobs.limits import JobLimits
from ..jobs.runner_settings import JobSettings, reconciler_default
from ..jobs.schedules import ScheduleLimits
from ..poolpage import SERVICE_NAME
from ..profiles import DEFAULT_PROFILES
from .part import Part
from .pool_service import SERVER_TOKEN_SCOPES as POOL_SERVER_TOKEN_SCOPES
from .pool_service import SERVICE_ROLE, service_url

# What the service's own token needs besides the pool page's: users' groups and directory identity.
JOB_SERVICE_SCOPES = ["read:users", "admin:auth_state"]
# What the pool page gives the servers' tokens (asking the gpu-pool service), plus submitting jobs.
SERVER_TOKEN_SCOPES = [*POOL_SERVER_TOKEN_SCOPES, JOBS_SCOPE]


def job_limits(c) -> dict:
    """The c.JobLimits options an admin set, checked here so that a mistake stops the hub at start."""
    JobLimits(config=c)
    return {k: v for k, v in c.JobLimits.items()}


def schedule_limits(c) -> dict:
    """The c.ScheduleLimits options an admin set, checked here (a mistake stops the hub at start)."""
    ScheduleLimits(config=c)
    return {k: v for k, v in c.ScheduleLimits.items()}


def job_settings(c, settings) -> JobSettings:
    """What the service needs, read from the hub's config `c` (the spawner's own options)."""
    spawner = c.GPUDockerSpawner
    swarm = c.GPUSwarmSpawner
    hub_ip = c.JupyterHub.hub_connect_ip if "hub_connect_ip" in c.JupyterHub else ""
    host = c.Inventory.host if "host" in c.Inventory else settings.gpu_host
    if engine(settings.spawner).spans_nodes:  # jobs lease GPUs of any node, as servers do
        return JobSettings(**{**asdict(_settings(c, settings, spawner, hub_ip, "")), "engine": settings.spawner,
                              "home_volume_driver_options": dict(swarm.get("home_volume_driver_options", {})),
                              "home_root_volume_options": dict(swarm.get("home_root_volume_options", {})),
                              "cpu_constraints": list(swarm.get("cpu_constraints", [])),
                              "node_down_grace": float(spawner_option(c, settings, "node_down_grace")),
                              "outbound_proxy": bool(spawner_option(c, settings, "outbound_proxy")),
                              "outbound_proxy_networks": list(swarm.get("outbound_proxy_networks", []))})
    return _settings(c, settings, spawner, hub_ip, host or socket.gethostname())  # the inventory's own default


def spawner_option(c, settings, name: str):
    """What the hub's spawner (this engine's class) reads for option `name` from config `c`:
    the most specific section that sets it, as traitlets reads them, else the option's own
    default (written once, on its trait)."""
    spawner_class = engine(settings.spawner).spawner_class
    for section in reversed(spawner_class.section_names()):
        if section in c and name in c[section]:
            return c[section][name]
    return spawner_class.class_traits()[name].default_value


def spawner_profiles(c) -> list:
    """The profiles the hub's spawner lends by, as configured in `c`."""
    return list(c.GPUDockerSpawner.get("profiles") or c.GPULendingSpawner.get("profiles") or DEFAULT_PROFILES)


def _settings(c, settings, spawner, hub_ip: str, host: str) -> JobSettings:
    # GPUHUB_JOB_MAX_SECONDS and GPUHUB_JOB_LOG_MAX_BYTES where set; else JobSettings's own defaults.
    given = {name: value for name, value in (("max_seconds", settings.job_max_seconds),
                                             ("log_max_bytes", settings.job_log_max_bytes)) if value is not None}
    return JobSettings(
        **given,
        profiles=spawner_profiles(c),
        host=host,
        network=spawner.get("network_name", settings.docker_network),
        prefix=spawner.get("prefix", settings.container_prefix),
        home_volume=spawner_option(c, settings, "home_volume_name"),
        home_name_escape=home_name_escape(c),
        home_mount_point=spawner_option(c, settings, "home_mount_point"),
        home_volume_prep_image=spawner_option(c, settings, "home_volume_prep_image"),
        home_prep_timeout=float(spawner_option(c, settings, "home_prep_timeout")),
        fallback_uid=spawner_option(c, settings, "fallback_uid"),
        fallback_gid=spawner_option(c, settings, "fallback_gid"),
        shm_size=spawner_option(c, settings, "shm_size"),
        bridge_ip=hub_ip,
        pool={k: v for k, v in c.GPUPool.items() if k != "db_url"},
        limits=job_limits(c),
        schedule_limits=schedule_limits(c),
        container_limits=ContainerLimits(config=c).settings(),
        reconcile_interval=float(c.Reconciler.get("interval", reconciler_default("interval"))),
        reconcile_min_age=float(c.Reconciler.get("min_lease_age", reconciler_default("min_lease_age"))),
    )


def home_name_escape(c) -> str:
    """How the servers escape {username} in their home volume's name (DockerSpawner.escape), for
    the jobs service to mount the same volumes; a callable of the admin's own cannot cross to
    the service, so it stops the hub with what to do instead."""
    from dockerspawner import DockerSpawner

    escape = "default"
    for section in (c.DockerSpawner, c.GPUDockerSpawner, c.GPUSwarmSpawner):  # the most specific last
        if "escape" in section:
            escape = section.escape
    if escape in ("default", DockerSpawner._escape):
        return "default"
    if escape in ("legacy", DockerSpawner._legacy_escape):
        return "legacy"
    raise ValueError(f"DockerSpawner.escape = {escape!r}: batch jobs mount the servers' home volumes by "
                     "name and can follow only DockerSpawner's own escape or 'legacy'; use one of those, "
                     "or turn jobs off (GPUHUB_JOBS=false)")


def jobs_part(settings, bridge_ip: str) -> Part:
    """What batch jobs add to the gpu-pool service's part (services.py sets them): the
    `custom:gpu-jobs` scope for every user, what the service's own token needs to run their
    jobs, and the notebook servers' way to submit (their token's scope, the service's URL)."""
    return Part(
        custom_scopes={JOBS_SCOPE: {"description": "Submit, read and cancel your own GPU batch jobs"}},
        role_scopes={"user": (JOBS_SCOPE,), SERVICE_ROLE: tuple(JOB_SERVICE_SCOPES)},
        oauth_scopes={SERVICE_NAME: (JOBS_SCOPE,)},
        # Notebook servers submit jobs with their own token, to the service's bridge address.
        environment={"GPUHUB_JOBS_URL": service_url(settings, bridge_ip)} if bridge_ip else {},
        server_token_scopes=tuple(SERVER_TOKEN_SCOPES),
    )


def configure_jobs(c, settings) -> None:
    """Check the jobs' settings in the hub's config `c` now, so that a mistake stops the hub at
    start; the service gets them from the hub's final config, as the JobSettings section of its
    file (service_file.py)."""
    job_settings(c, settings)
