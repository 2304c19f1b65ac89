"""A job's unit (its container), as engine-neutral data: pure, no engine calls.

The GPU uuids, lease labels and config digest come from spawner/containers.py, the same
builders as the notebook servers'; the job adds its command (run through the image's own
entrypoint, in its working directory), its home volume, its CPU/memory limits and no
network unless its profile allows the hub's.  The engines add the lock-down
(spawner/docker/jobs.py, spawner/swarm/jobs.py).
"""

from __future__ import annotations

from ..containers import config_digest, job_unit_name, lease_labels, runtime_env
from ..labels import LABEL_JOB
from ..pool.ledger.job_records import Job, job_server_name
from ..profiles import Profile
from .engine import UnitSpec
from .settings import JobSettings

# Runs the user's argv as given (no shell parsing of it) inside the working
# directory, or says plainly that the directory is missing.
WORKDIR_WRAPPER = ('cd -- "$0" 2>/dev/null || { echo "gpu-job: there is no directory $0" >&2; exit 2; }; '
                   'exec "$@"')


def container_name(settings: JobSettings, job_id: int) -> str:
    return job_unit_name(settings.prefix, job_id)


def workdir_path(settings: JobSettings, workdir: str) -> str:
    home = settings.home_mount_point.rstrip("/")
    return f"{home}/{workdir}" if workdir else home


def unit_spec(job: Job, profile: Profile, settings: JobSettings, home_volume: str, pool_id: str,
              node: str = "") -> UnitSpec:
    """The job's one unit, on `node` (its GPUs' host; "" = the engine's own)."""
    gpus = tuple(job.gpu_uuids)
    digest = config_digest(job.lease_id, gpus, profile.image, profile.cpu_limit, profile.mem_limit,
                           job.uid, job.gid)
    labels = lease_labels(job.user, job_server_name(job.id), gpus, node or job.host, job.lease_id, pool_id, digest)
    labels[LABEL_JOB] = str(job.id)
    env = {"HOME": settings.home_mount_point, "GPUHUB_JOB_ID": str(job.id), **runtime_env(profile.cpu_limit, gpus)}
    return UnitSpec(
        name=container_name(settings, job.id),
        image=profile.image,
        command=["/bin/sh", "-c", WORKDIR_WRAPPER, workdir_path(settings, job.workdir), *job.command],
        user=f"{job.uid}:{job.gid}",
        env=env,
        labels=labels,
        working_dir=settings.home_mount_point,
        volumes={home_volume: settings.home_mount_point},
        gpus=gpus,
        host=node,
        network=settings.network if profile.job_network else None,
        cpu_limit=profile.cpu_limit or None,
        mem_limit=profile.mem_limit or None,
        shm_size=settings.shm_size,
    )
