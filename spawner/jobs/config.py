"""Batch jobs in the hub's config: the `custom:gpu-jobs` scope, who holds it, and what the
gpu-pool service (which runs the jobs) and the notebook servers (which submit them) need.

Called by apply_settings after the pool page's own configuration (GPUHUB_JOBS).
"""

from __future__ import annotations

import os

from ..culling import without_named
from ..poolpage import SERVICE_NAME
from ..poolpage.service import ACCESS_SCOPE
from . import JOBS_SCOPE
from .settings import ENV_NAME, JobSettings

SERVICE_ROLE = "gpu-pool-service"
# JupyterHub's `server` role, plus submitting jobs to the gpu-pool service.
SERVER_TOKEN_SCOPES = ["users:activity!user", "access:servers!server", JOBS_SCOPE, ACCESS_SCOPE]


def job_settings(c, settings) -> JobSettings:
    spawner = c.GPUDockerSpawner
    hub_ip = c.JupyterHub.hub_connect_ip if "hub_connect_ip" in c.JupyterHub else ""
    return JobSettings(
        profiles=list(spawner.profiles),
        host=settings.gpu_host or os.uname().nodename,
        network=settings.docker_network,
        prefix=settings.container_prefix,
        home_volume=settings.home_volume,
        fallback_uid=spawner.get("fallback_uid", JobSettings.fallback_uid),
        fallback_gid=spawner.get("fallback_gid", JobSettings.fallback_gid),
        max_seconds=settings.job_max_seconds,
        log_max_bytes=settings.job_log_max_bytes,
        bridge_ip=hub_ip,
        pool={k: v for k, v in c.GPUPool.items() if k != "db_url"},
    )


def configure_jobs(c, settings) -> None:
    """Add jobs to a hub config `c` whose gpu-pool service is configured (safe to call twice)."""
    section = c.JupyterHub
    custom = dict(section.custom_scopes) if "custom_scopes" in section else {}
    custom[JOBS_SCOPE] = {"description": "Submit, read and cancel your own GPU batch jobs"}
    section.custom_scopes = custom

    roles = list(section.load_roles) if "load_roles" in section else []
    for role in roles:
        if role.get("name") == "user" and JOBS_SCOPE not in role["scopes"]:
            role["scopes"] = [*role["scopes"], JOBS_SCOPE]
    roles = without_named(roles, SERVICE_ROLE) + [{
        "name": SERVICE_ROLE,
        "description": "The gpu-pool service reads users' groups and directory identity to run their jobs",
        "scopes": ["read:users", "admin:auth_state"],
        "services": [SERVICE_NAME],
    }]
    section.load_roles = roles

    js = job_settings(c, settings)
    services = []
    for spec in section.services:
        if spec.get("name") == SERVICE_NAME:
            env = {**spec.get("environment", {}), ENV_NAME: js.to_env()}
            if os.environ.get("DOCKER_HOST"):
                env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
            allowed = [s for s in spec.get("oauth_client_allowed_scopes", []) if s != JOBS_SCOPE]
            spec = {**spec, "environment": env, "oauth_client_allowed_scopes": [*allowed, JOBS_SCOPE]}
        services.append(spec)
    section.services = services

    # Notebook servers submit jobs with their own token, to the service's bridge address.
    c.GPUDockerSpawner.server_token_scopes = SERVER_TOKEN_SCOPES
    if js.bridge_ip:
        # update(): merges with what others add (the culler's), whether set or lazy.
        c.GPUDockerSpawner.environment.update(
            {"GPUHUB_JOBS_URL": f"http://{js.bridge_ip}:{settings.pool_page_port}/services/{SERVICE_NAME}/"})
