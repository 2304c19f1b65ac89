"""A job's units (its containers), as engine-neutral data: pure, no engine calls.

The GPU uuids, lease labels and config digest come from spawner/engines/common/containers.py, the same
builders as the notebook servers'; the job adds its command (run through the image's own
entrypoint, in its working directory), its home volume, its CPU/memory limits and no
network unless its profile allows the hub's.  The engines add the lock-down
(spawner/engines/common/job_containers.py, spawner/engines/swarm/job_services.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..engines.common.containers import config_digest, job_unit_name, lease_labels, runtime_env
from ..engines.common.labels import LABEL_JOB
from ..pool.ledger.job_records import Job, job_server_name
from ..profiles import Profile
from .engine import UnitSpec
from .runner_settings import JobSettings

# Makes the job's checkpoint directory (GPUHUB_CHECKPOINT_DIR), then runs the user's argv as
# given (no shell parsing of it) inside the working directory, or says plainly that the
# directory is missing.
WORKDIR_WRAPPER = ('mkdir -p -- "$GPUHUB_CHECKPOINT_DIR" 2>/dev/null; '
                   'cd -- "$0" 2>/dev/null || { echo "gpu-job: there is no directory $0" >&2; exit 2; }; '
                   'exec "$@"')
# Where a job's checkpoints go, under its user's home: one directory per job, the same for every
# attempt of it (a reclaimed job queued again finds what its first attempt saved there).
CHECKPOINT_SUBDIR = ".gpuhub/checkpoints/job-{job_id}"


def container_name(settings: JobSettings, job_id: int) -> str:
    return job_unit_name(settings.prefix, job_id)


def workdir_path(settings: JobSettings, workdir: str) -> str:
    home = settings.home_mount_point.rstrip("/")
    return f"{home}/{workdir}" if workdir else home


def checkpoint_dir(settings: JobSettings, job_id: int) -> str:
    """The job's checkpoint directory inside its container (GPUHUB_CHECKPOINT_DIR)."""
    return f"{settings.home_mount_point.rstrip('/')}/{CHECKPOINT_SUBDIR.format(job_id=job_id)}"


def job_env(job: Job, settings: JobSettings) -> dict[str, str]:
    """What every unit of a job has in its environment, whatever its engine or shape."""
    return {"HOME": settings.home_mount_point, "GPUHUB_JOB_ID": str(job.id),
            "GPUHUB_CHECKPOINT_DIR": checkpoint_dir(settings, job.id)}


@dataclass(frozen=True)
class Unit:
    """One unit of a job's group (group.py): what sets it apart from the job's other units."""

    index: int
    name: str  # the container or service name (a cluster worker's: also its name on the network)
    server_name: str  # what its lease carries: `job/12`, or a worker's `job/12/worker-1`
    lease_id: int | None
    gpus: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # beyond job_env: a worker's TF_CONFIG
    aliases: tuple[str, ...] = ()  # its names on its group's own network


def only_unit(job: Job, settings: JobSettings) -> Unit:
    """The unit of a job of one unit: its lease and GPUs are the job's."""
    return Unit(0, job.container or container_name(settings, job.id), job_server_name(job.id), job.lease_id,
                tuple(job.gpu_uuids))


def unit_spec(job: Job, profile: Profile, settings: JobSettings, home_volume: str, pool_id: str,
              node: str = "", stop_grace: float | None = None, unit: Unit | None = None,
              network: str | None = None) -> UnitSpec:
    """A unit of the job (`unit`; by default its only one), on `node` (its GPUs' host; "" = the
    engine's own); `stop_grace`: as UnitSpec's (a borrowed lease's notice); `network`: its group's
    own, else the hub's where the profile allows jobs a network, else none."""
    unit = unit if unit is not None else only_unit(job, settings)
    digest = config_digest(unit.lease_id, unit.gpus, profile.image, profile.cpu_limit, profile.mem_limit,
                           job.uid, job.gid)
    labels = lease_labels(job.user, unit.server_name, unit.gpus, node or job.host, unit.lease_id, pool_id, digest)
    labels[LABEL_JOB] = str(job.id)
    env = {**job_env(job, settings), **unit.env, **runtime_env(profile.cpu_limit, unit.gpus)}
    return UnitSpec(
        name=unit.name,
        image=profile.image,
        command=["/bin/sh", "-c", WORKDIR_WRAPPER, workdir_path(settings, job.workdir), *job.command],
        user=f"{job.uid}:{job.gid}",
        env=env,
        labels=labels,
        working_dir=settings.home_mount_point,
        volumes={home_volume: settings.home_mount_point},
        gpus=unit.gpus,
        host=node,
        # A group's own network only, never the hub's shared one (where every user's server
        # could reach a cluster's unauthenticated gRPC port).
        network=network or (settings.network if profile.job_network else None),
        aliases=unit.aliases,
        cpu_limit=profile.cpu_limit or None,
        mem_limit=profile.mem_limit or None,
        shm_size=settings.shm_size,
        stop_grace=stop_grace,
    )
