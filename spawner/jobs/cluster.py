"""What makes a job's group of units a TensorFlow cluster: pure names, TF_CONFIG and log marks.

A job with `workers` N > 1 is a group of N units (group.py), leased in one grant
(GPUPool.acquire_gang: all or nothing, one queue entry), one unit per worker on its lease's
host, all on a network of their own that only they share (internal: no route out, no hub;
with the profile's `job_network`, on one Docker host a route out through the host's NAT and
the hub's API under the host's rules, engines/common/firewall.py, on Swarm an HTTPS proxy of
the network's own, engines/swarm/job_services.py; never the hub's shared network, where any
user's server would reach the workers' unauthenticated gRPC port).  Each worker gets
`TF_CONFIG` naming every worker by a stable name (its unit name, an alias on that network)
and its own index; worker 0 is the chief.  This module gives the group those parts; the
runner drives a cluster as it drives any group (group.py says the rules: the chief's exit
0 is the cluster's success, a worker that fails or whose node stays quiet ends it).
"""

from __future__ import annotations

import json

from .runner_settings import JobSettings
from .spec import container_name

# The port every worker's TensorFlow server listens on (each worker is its own container).
TF_PORT = 2222


def worker_name(settings: JobSettings, job_id: int, index: int) -> str:
    """Worker `index`'s unit name, also its name on the cluster's network."""
    return f"{container_name(settings, job_id)}-w{index}"


def network_name(settings: JobSettings, job_id: int) -> str:
    return f"{container_name(settings, job_id)}-net"


def tf_config(names: list[str], index: int, port: int = TF_PORT) -> str:
    """TensorFlow's cluster spec for worker `index` of the workers called `names` (0: the chief)."""
    return json.dumps({"cluster": {"worker": [f"{n}:{port}" for n in names]},
                       "task": {"type": "worker", "index": index}}, sort_keys=True)


def worker_env(names: list[str], index: int) -> dict[str, str]:
    """What worker `index` of the workers called `names` adds to its job's environment."""
    return {"GPUHUB_JOB_WORKER": str(index), "GPUHUB_JOB_WORKERS": str(len(names)),
            "TF_CONFIG": tf_config(names, index)}


def units_of(leases, workers: int, host: str) -> list[dict]:
    """What the job records of its workers: each one's host, lease and GPUs (a CPU cluster: none)."""
    if not leases:
        return [{"worker": i, "host": host, "lease_id": None, "gpus": []} for i in range(workers)]
    return [{"worker": i, "host": lease.host, "lease_id": lease.id, "gpus": list(lease.gpu_uuids)}
            for i, lease in enumerate(leases)]


def merge_logs(logs: list[tuple[int, str]]) -> str:
    """Every worker's output, each line marked `[worker i]`, worker by worker."""
    out = []
    for index, text in logs:
        out += [f"[worker {index}] {line}" for line in text.splitlines()]
    return "\n".join(out) + ("\n" if out else "")


def worker_log(merged: str, index: int) -> str:
    """Worker `index`'s share of a merged log (merge_logs' output), unmarked: what an ended
    cluster's `?worker=i` shows, its workers' containers being gone."""
    mark = f"[worker {index}] "
    lines = [line[len(mark):] for line in merged.splitlines() if line.startswith(mark)]
    return "\n".join(lines) + ("\n" if lines else "")
