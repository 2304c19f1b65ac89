"""What every container that holds a lease is made of: pure builders, no Docker calls.

Notebook servers, jobs and Swarm tasks are all locked down the same way
(non-root, no capabilities, no-new-privileges, exactly the leased GPUs) and
labelled the same way, so the reconciler can judge any of them.  The engines
turn these plain dicts into their own API's shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable

from traitlets import Int, TraitError, Unicode, validate
from traitlets.config import Configurable

from .labels import LABEL_CONFIG, LABEL_GPUS, LABEL_HOST, LABEL_LEASE, LABEL_POOL, LABEL_SERVER, LABEL_USER

# The security model of every user container; configured extras never override it.
HARDENING = {
    "security_opt": ["no-new-privileges"],
    "cap_drop": ["ALL"],
    "cap_add": [],
    "privileged": False,
}


def hardened_host_config() -> dict:
    """A fresh copy of the settings that lock a user container down."""
    return json.loads(json.dumps(HARDENING))


# Helpers (a home's hand-over, the doctor's probe) run a shell and a few tools, never more.
HELPER_PIDS_LIMIT = 64
LOG_DRIVERS = ("json-file", "local")


class ContainerLimits(Configurable):
    """Bounds on every container the project creates: notebook servers, batch jobs, the
    short-lived helpers that prepare homes, and the doctor's probe."""

    pids_limit = Int(
        4096,
        config=True,
        help="""Most processes and threads one container may run at once (Docker's `--pids-limit`).

        A fork bomb in a notebook or a job then stays inside its container
        instead of exhausting the host's process table.  Threads count: leave
        room for data loaders and math libraries (a TensorFlow process runs
        a few dozen).  Helper containers get at most 64.
        """,
    )

    log_driver = Unicode(
        "json-file",
        config=True,
        help="""Docker log driver of the project's containers: `json-file` or `local`.

        Both keep at most `log_max_files` files of `log_max_size` each, so a
        job that prints without end cannot fill /var/lib/docker, and both
        serve `docker logs` (which the job pages read).
        """,
    )

    log_max_size = Unicode(
        "10m",
        config=True,
        help="""Size at which a container's log file is rotated (Docker's `max-size`: `10m`, `512k`, `1g`).

        A container's log on disk is at most `log_max_size` x `log_max_files`;
        older output is dropped.  A job keeps the last GPUHUB_JOB_LOG_MAX_BYTES
        of it after it ends.
        """,
    )

    log_max_files = Int(
        3,
        config=True,
        help="Log files kept per container, the current one included (Docker's `max-file`).",
    )

    @validate("pids_limit", "log_max_files")
    def _check_positive(self, proposal):
        if proposal.value < 1:
            raise TraitError(f"ContainerLimits.{proposal.trait.name} must be >= 1")
        return proposal.value

    @validate("log_driver")
    def _check_driver(self, proposal):
        if proposal.value not in LOG_DRIVERS:
            raise TraitError(f"ContainerLimits.log_driver must be one of {', '.join(LOG_DRIVERS)}, "
                             f"not {proposal.value!r}")
        return proposal.value

    @validate("log_max_size")
    def _check_size(self, proposal):
        import re

        if not re.fullmatch(r"[1-9][0-9]*[kmg]?", proposal.value):
            raise TraitError(f"ContainerLimits.log_max_size must be a size like 10m, 512k or 1g, "
                             f"not {proposal.value!r}")
        return proposal.value

    def log_options(self) -> dict[str, str]:
        return {"max-size": self.log_max_size, "max-file": str(self.log_max_files)}

    def host_config(self, helper: bool = False) -> dict:
        """Docker host config (create_host_config keywords) bounding a container's processes and log."""
        import docker.types

        pids = min(self.pids_limit, HELPER_PIDS_LIMIT) if helper else self.pids_limit
        return {"pids_limit": pids,
                "log_config": docker.types.LogConfig(type=self.log_driver, config=self.log_options())}

    def settings(self) -> dict:
        """Its values as plain data, for another process (the gpu-pool service): ContainerLimits(**them)."""
        return {name: getattr(self, name) for name in self.class_own_traits(config=True)}


def gpu_host_config(gpu_uuids: Iterable[str]) -> dict:
    """Docker host config giving a container exactly these GPUs, by UUID, and no others.

    Without GPUs the container runs on `runc` even where `nvidia` is the host's
    default runtime, which would otherwise show it every GPU."""
    import docker.types

    uuids = list(gpu_uuids)
    if not uuids:
        return {"device_requests": [], "runtime": "runc"}
    return {"device_requests": [
        docker.types.DeviceRequest(driver="nvidia", device_ids=uuids, capabilities=[["gpu"]])]}


def config_digest(lease_id, gpu_uuids: Iterable[str], image: str, cpu_limit, mem_limit,
                  uid: int, gid: int) -> str:
    """A digest of what a container is made for (lease, GPUs, image, limits, identity)."""
    made_for = {
        "lease": lease_id, "gpus": list(gpu_uuids), "image": image,
        "cpu": cpu_limit, "mem": str(mem_limit), "user": f"{uid}:{gid}",
    }
    return hashlib.sha256(json.dumps(made_for, sort_keys=True).encode()).hexdigest()[:16]


def lease_labels(user: str, server: str, gpu_uuids: Iterable[str], host: str, lease_id,
                 pool_id: str, digest: str = "") -> dict[str, str]:
    """The labels by which the reconciler knows a container's lease, owner and ledger."""
    labels = {
        LABEL_USER: user,
        LABEL_SERVER: server,
        LABEL_GPUS: ",".join(gpu_uuids),
        LABEL_HOST: host,
        LABEL_LEASE: str(lease_id) if lease_id is not None else "",
        LABEL_POOL: pool_id,
    }
    if digest:
        labels[LABEL_CONFIG] = digest
    return labels


def runtime_env(cpu_limit, gpu_uuids: Iterable[str]) -> dict[str, str]:
    """Environment every lease-holding container gets: thread counts that match its CPU
    limit, and the NVIDIA runtime's view (no GPU at all without a lease)."""
    env: dict[str, str] = {}
    if cpu_limit:
        threads = str(max(1, math.ceil(cpu_limit)))
        env.update({
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "TF_NUM_INTRAOP_THREADS": threads,
            "TF_NUM_INTEROP_THREADS": str(min(2, int(threads))),
        })
    if not list(gpu_uuids):
        # Even where nvidia is the default runtime, a CPU container gets no GPU.
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    else:
        env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
    return env


def job_unit_name(prefix: str, job_id: int) -> str:
    """A batch job's container (service) name; a cluster's workers add `-w<index>`."""
    return f"{prefix}-job-{job_id}"


def is_job_unit_name(name: str, prefix: str) -> bool:
    """Whether `name` is one a job's unit takes (container_name, a cluster's worker_name), under
    the hub's container `prefix`: no server may have it (a user name written into a server's
    name by DockerSpawner's escape can spell one: 'job-5' as it is under escape = 'legacy',
    'job%' as 'job-25' under the default)."""
    return re.fullmatch(rf"{re.escape(prefix)}-job-[0-9]+(?:-w[0-9]+)?", name) is not None
