"""A job's container, as plain Docker API arguments: pure, no Docker calls.

The lockdown, GPU device request, lease labels and config digest come from
spawner/containers.py, the same builders as the notebook servers'; the job adds
its command (run through the image's own entrypoint, in its working
directory), its home volume, its CPU/memory limits and no network unless its
profile allows the hub's.
"""

from __future__ import annotations

from ..containers import ContainerLimits, config_digest, gpu_host_config, hardened_host_config, lease_labels, runtime_env
from ..labels import LABEL_JOB
from ..pool.jobs import Job, job_server_name
from ..profiles import Profile
from .settings import JobSettings

# Runs the user's argv as given (no shell parsing of it) inside the working
# directory, or says plainly that the directory is missing.
WORKDIR_WRAPPER = ('cd -- "$0" 2>/dev/null || { echo "gpu-job: there is no directory $0" >&2; exit 2; }; '
                   'exec "$@"')


def container_name(settings: JobSettings, job_id: int) -> str:
    return f"{settings.prefix}-job-{job_id}"


def workdir_path(settings: JobSettings, workdir: str) -> str:
    home = settings.home_mount_point.rstrip("/")
    return f"{home}/{workdir}" if workdir else home


def container_spec(job: Job, profile: Profile, settings: JobSettings, home_volume: str,
                   pool_id: str) -> tuple[dict, dict]:
    """(create_container kwargs without host_config, create_host_config kwargs)."""
    gpus = list(job.gpu_uuids)
    digest = config_digest(job.lease_id, gpus, profile.image, profile.cpu_limit, profile.mem_limit,
                           job.uid, job.gid)
    labels = lease_labels(job.user, job_server_name(job.id), gpus, job.host, job.lease_id, pool_id, digest)
    labels[LABEL_JOB] = str(job.id)
    env = {"HOME": settings.home_mount_point, "GPUHUB_JOB_ID": str(job.id),
           **runtime_env(profile.cpu_limit, gpus)}
    create = {
        "image": profile.image,
        "command": ["/bin/sh", "-c", WORKDIR_WRAPPER, workdir_path(settings, job.workdir), *job.command],
        "user": f"{job.uid}:{job.gid}",
        "environment": env,
        "labels": labels,
        "working_dir": settings.home_mount_point,
        "name": container_name(settings, job.id),
        "network_disabled": not profile.job_network,
    }
    host = {
        **hardened_host_config(),
        **gpu_host_config(gpus),
        "binds": {home_volume: {"bind": settings.home_mount_point, "mode": "rw"}},
        "shm_size": settings.shm_size,
        "network_mode": settings.network if profile.job_network else "none",
        **ContainerLimits(**settings.container_limits).host_config(),
    }
    if profile.cpu_limit:
        host["nano_cpus"] = int(profile.cpu_limit * 1e9)
    if profile.mem_limit:
        host["mem_limit"] = profile.mem_limit
    return create, host
