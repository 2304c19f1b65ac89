#!/usr/bin/env python3
"""Batch job benchmarks, on a real hub (with its gpu-pool service) and a real dockerd.

1. Job POST -> container running (Docker's own StartedAt), against `docker run -d` of the
   same image and command, alternating in one run (goal: ratio <= 1.2).
2. GPU-hours held for the same training: as a job (the lease lasts while it computes), and
   as a notebook session (spawn, the same training run inside it, stop at once), plus what
   that session holds when it is left to the idle culler (+ GPUHUB_CULL_TIMEOUT_GPU).

    .venv/bin/python bench/bench_jobs.py [--rounds 5] [--epochs 1] [--image IMG]

The training is the images' train.py when the image has it (the MKL image, default when
built), else a 10 s sleep standing in for it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment, median  # noqa: E402
from devservices.hub import cleanup_hub, prepare_hub, wait_for  # noqa: E402

CULL_TIMEOUT_GPU = 900


def started_at(container) -> float:
    """Docker's own start time of the container (RFC 3339 with nanoseconds), as a Unix time."""
    container.reload()
    head, _, fraction = container.attrs["State"]["StartedAt"].rstrip("Z").partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp() + float("0." + (fraction or "0"))


def jobs_api(hub, method, path, token, **kwargs):
    import requests

    return requests.request(method, f"{hub.url}/services/gpu-pool/api/jobs{path}",
                            headers={"Authorization": f"token {token}"}, timeout=60, **kwargs)


def wait_job(hub, token, job_id, states, timeout=900):
    return wait_for(lambda: (j := jobs_api(hub, "GET", f"/{job_id}", token).json())["state"] in states and j,
                    timeout=timeout, what=f"job {job_id}", interval=0.05)


def container_started(hub, client, job_id: int) -> float:
    """When job `job_id`'s container started (Docker's own StartedAt), once it has."""
    name = f"{hub.prefix}-job-{job_id}"
    container = wait_for(lambda: [c for c in client.containers.list(all=True, filters={"name": name},
                                                                    ignore_removed=True) if c.name == name],
                         timeout=120, interval=0.05)[0]
    wait_for(lambda: container.reload() or container.attrs["State"]["StartedAt"][:4] != "0001",
             timeout=120, interval=0.05)
    return started_at(container)


def job_to_running(hub, client, token, command) -> float:
    began = time.time()
    r = jobs_api(hub, "POST", "", token, json={"profile": "tf-gpu-1", "command": command})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    seconds = container_started(hub, client, job_id) - began
    wait_job(hub, token, job_id, ("succeeded", "failed"))
    return seconds


def docker_run_to_running(client, image, command) -> float:
    began = time.time()
    container = client.containers.run(image, command, detach=True, network_mode="none")
    try:
        wait_for(lambda: container.reload() or container.attrs["State"]["StartedAt"][:4] != "0001",
                 timeout=120, interval=0.05)
        return started_at(container) - began
    finally:
        container.remove(force=True)


def gpu_hours(lease) -> float:
    return lease.gpu_hours()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--image", default="", help="image of the profiles (default: the MKL image if built)")
    args = parser.parse_args()

    client, minimal, network = environment()
    image = args.image
    if not image:
        try:
            client.images.get("gpuhub/notebook-mkl:latest")
            image = "gpuhub/notebook-mkl:latest"
        except Exception:
            image = minimal
    has_train = client.containers.run(image, ["sh", "-c", "test -f /opt/gpuhub/skel/tensorflow-examples/train.py "
                                              "&& echo yes || echo no"], remove=True, network_mode="none",
                                      entrypoint=[]).decode().strip() == "yes"
    if has_train:
        training = ["python", "train.py", "--epochs", str(args.epochs), "--model_path", "bench.keras"]
        workdir = "tensorflow-examples"
    else:
        training, workdir = ["sleep", "10"], ""

    with tempfile.TemporaryDirectory() as tmp:
        hub = prepare_hub(Path(tmp), image, network, env={"GPUHUB_GPU_IMAGE": image, "GPUHUB_CPU_IMAGE": image})
        try:
            hub.start()
            hub.create_user("bench")
            token = hub.user_token("bench")
            wait_for(lambda: jobs_api(hub, "GET", "", token).status_code == 200, timeout=60, what="the service")

            # 1. POST -> running, against docker run (one warm-up each: the home volume, caches)
            command = ["sleep", "1"]
            job_to_running(hub, client, token, command)
            docker_run_to_running(client, image, command)
            jobs, runs = [], []
            for _ in range(args.rounds):
                jobs.append(job_to_running(hub, client, token, command))
                runs.append(docker_run_to_running(client, image, command))
            job_s, run_s = median(jobs), median(runs)
            print(f"\nJob POST -> container running vs docker run, {args.rounds} rounds, image {image}")
            print("| path | median s | min s | max s |")
            print("|---|---|---|---|")
            print(f"| job (REST POST, queue, lease, home, container) | {job_s:.3f} | {min(jobs):.3f} "
                  f"| {max(jobs):.3f} |")
            print(f"| docker run -d | {run_s:.3f} | {min(runs):.3f} | {max(runs):.3f} |")
            print(f"| ratio | {job_s / run_s:.2f} (goal <= 1.2) | | |")

            # 2. GPU-hours for the same training
            r = jobs_api(hub, "POST", "", token, json={"profile": "tf-gpu-1", "command": training, "workdir": workdir})
            job = wait_job(hub, token, r.json()["id"], ("succeeded", "failed"))
            job_lease = hub.ledger().lease(job["lease_id"])
            hub.start_server("bench", {"profile": "tf-gpu-1"})
            box = [c for c in hub.containers(client) if c.name == f"{hub.prefix}-bench"][0]
            code, out = box.exec_run(training, workdir=f"/home/jovyan/{workdir}")
            assert code == 0, out[-2000:]
            lease_id = hub.server_model("bench")["state"]["gpu_lease_id"]
            hub.stop_server("bench")
            nb_lease = hub.ledger().lease(lease_id)
            held_job, held_nb = gpu_hours(job_lease), gpu_hours(nb_lease)
            culled = held_nb + CULL_TIMEOUT_GPU / 3600
            print(f"\nGPU-hours held for one training ({' '.join(training)}), 1 GPU")
            print("| how | lease s | GPU-hours | vs job |")
            print("|---|---|---|---|")
            print(f"| job ({job['state']}) | {held_job * 3600:.1f} | {held_job:.5f} | 1.00 |")
            print(f"| notebook: spawn, train, stop at once | {held_nb * 3600:.1f} | {held_nb:.5f} "
                  f"| {held_nb / held_job:.2f} |")
            print(f"| notebook left to the culler (+{CULL_TIMEOUT_GPU} s idle) | {culled * 3600:.1f} | {culled:.5f} | "
                  f"{culled / held_job:.1f} |")
        finally:
            cleanup_hub(hub, client)


if __name__ == "__main__":
    main()
