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
from typing import Iterable

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
