#!/usr/bin/env python3
"""Cluster job benchmarks: start-up against docker run, multi-worker training, gang leasing.

1. A cluster of 2 and of 4 workers: REST POST -> every worker's container running (Docker's
   own StartedAt of the last one), against `docker run -d` of the same containers one after
   another on an internal network (goal: ratio <= 1.2), alternating in one run.
2. One epoch of the example CNN on MNIST-format data (28x28) with 1 worker and with 2
   workers (MultiWorkerMirroredStrategy), on CPU, in the MKL image: reported, not a goal
   (CPU all-reduce over a bridge, on a machine whose cores the workers share).
3. Gang leasing under contention, on a real SQLite ledger: 8 clusters of 2 x 1 GPU and 16
   single-GPU requests against 4 GPUs, all at once; every request must be served, no cluster
   may ever hold part of its GPUs (its leases start in one transaction), none may deadlock.

    .venv/bin/python bench/bench_clusters.py [--rounds 3] [--skip-training] [--only-ledger]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_jobs import jobs_api, started_at, wait_job  # noqa: E402
from bench.common import environment, median, percentile  # noqa: E402

# --- 1. POST -> all workers running ------------------------------------------------------


def cluster_to_running(hub, client, token, workers: int) -> float:
    from devservices.hub import wait_for

    began = time.time()
    r = jobs_api(hub, "POST", "", token, json={"profile": "tf-gpu-1", "command": ["sleep", "2"],
                                               "workers": workers})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    names = [f"{hub.prefix}-job-{job_id}-w{i}" for i in range(workers)]

    def all_started():
        found = {c.name: c for c in client.containers.list(all=True, filters={"name": f"{hub.prefix}-job-{job_id}-"},
                                                           ignore_removed=True)}
        if not set(names) <= set(found):
            return None
        for c in found.values():
            c.reload()
        return [found[n] for n in names] if all(found[n].attrs["State"]["StartedAt"][:4] != "0001"
                                                 for n in names) else None

    containers = wait_for(all_started, timeout=120, interval=0.05)
    seconds = max(started_at(c) for c in containers) - began
    wait_job(hub, token, job_id, ("succeeded", "failed"))
    return seconds


def docker_runs_to_running(client, image, workers: int) -> float:
    """The same N containers by hand: a network, then `docker run -d` one after another."""
    tag = uuid.uuid4().hex[:8]
    began = time.time()
    network = client.networks.create(f"gpuhub-bench-{tag}", driver="bridge", internal=True)
    containers = []
    try:
        for i in range(workers):
            containers.append(client.containers.run(
                image, ["sleep", "2"], detach=True, name=f"gpuhub-bench-{tag}-w{i}", network=network.name,
                environment={"TF_CONFIG": "{}"}, user="1000:100", cap_drop=["ALL"],
                security_opt=["no-new-privileges"]))
        from devservices.hub import wait_for

        wait_for(lambda: all(c.reload() or c.attrs["State"]["StartedAt"][:4] != "0001" for c in containers),
                 timeout=120, interval=0.05)
        return max(started_at(c) for c in containers) - began
    finally:
        for c in containers:
            c.remove(force=True)
        network.remove()


def bench_startup(client, image, network, rounds: int) -> None:
    from devservices.hub import cleanup_hub, prepare_hub, wait_for

    with tempfile.TemporaryDirectory() as tmp:
        hub = prepare_hub(Path(tmp), image, network, env={"GPUHUB_GPU_IMAGE": image, "GPUHUB_CPU_IMAGE": image,
                                                          "GPUHUB_SIMULATED_GPUS": "4"})
        try:
            hub.start()
            hub.create_user("bench")
            token = hub.user_token("bench")
            wait_for(lambda: jobs_api(hub, "GET", "", token).status_code == 200, timeout=60, what="the service")
            print(f"\nCluster POST -> every worker running vs docker run one after another, {rounds} rounds, "
                  f"image {image}")
            print("| workers | cluster median s | min s | max s | docker run x N median s | ratio |")
            print("|---|---|---|---|---|---|")
            for workers in (2, 4):
                cluster_to_running(hub, client, token, workers)  # warm-up: the home volume, caches
                docker_runs_to_running(client, image, workers)
                ours, theirs = [], []
                for _ in range(rounds):
                    ours.append(cluster_to_running(hub, client, token, workers))
                    theirs.append(docker_runs_to_running(client, image, workers))
                print(f"| {workers} | {median(ours):.3f} | {min(ours):.3f} | {max(ours):.3f} | "
                      f"{median(theirs):.3f} | {median(ours) / median(theirs):.2f} (goal <= 1.2) |")
        finally:
            cleanup_hub(hub, client)


# --- 2. training: 1 worker vs 2 ----------------------------------------------------------

MAKE_MNIST = r"""
import gzip, struct, numpy as np, os
from PIL import Image
from sklearn.datasets import load_digits
d = load_digits()
big = np.stack([np.asarray(Image.fromarray((im * 16).astype('uint8')).resize((28, 28))) for im in d.images])
def idx(name, a):
    head = struct.pack('>BBBB', 0, 0, 8, a.ndim) + struct.pack(f'>{a.ndim}I', *a.shape)
    with gzip.open(f'/data/{name}.gz', 'wb') as f: f.write(head + a.astype('uint8').tobytes())
idx('train-images-idx3-ubyte', big[:1500]); idx('train-labels-idx1-ubyte', d.target[:1500])
idx('t10k-images-idx3-ubyte', big[1500:]); idx('t10k-labels-idx1-ubyte', d.target[1500:])
"""
EXAMPLES = "/opt/gpuhub/skel/tensorflow-examples"


def summary_of(out: str) -> dict:
    return json.loads(out.split("summary: ", 1)[1].splitlines()[0])


def bench_training(client, image: str, epochs: int) -> None:
    tag = uuid.uuid4().hex[:8]
    volume = client.volumes.create(f"gpuhub-bench-mnist-{tag}")
    network = client.networks.create(f"gpuhub-bench-{tag}", driver="bridge", internal=True)
    data = {volume.name: {"bind": "/data", "mode": "rw"}}
    try:
        client.containers.run(image, ["python", "-c", MAKE_MNIST], remove=True, entrypoint=[], user="0",
                              volumes=data, network_mode="none")
        train = ["python", f"{EXAMPLES}/train.py", "--epochs", str(epochs), "--images_path", "/data",
                 "--model_path", "/tmp/m.keras"]
        ro = {volume.name: {"bind": "/data", "mode": "ro"}}
        single = client.containers.run(image, train, remove=True, entrypoint=[], volumes=ro, network_mode="none",
                                       environment={"CUDA_VISIBLE_DEVICES": "-1"}).decode()
        names = [f"gpuhub-bench-{tag}-w{i}" for i in range(2)]
        workers = []
        for i, name in enumerate(names):
            config = {"cluster": {"worker": [f"{n}:2222" for n in names]}, "task": {"type": "worker", "index": i}}
            workers.append(client.containers.run(
                image, [*train, "--strategy", "multiworker"], detach=True, entrypoint=[], name=name,
                volumes=ro, network=network.name, environment={"TF_CONFIG": json.dumps(config)}))
        for w in workers:
            assert w.wait(timeout=1800)["StatusCode"] == 0, w.logs()[-2000:]
        chief = workers[0].logs(stderr=False).decode()
        for w in workers:
            w.remove(force=True)
        one, two = summary_of(single), summary_of(chief)
        print(f"\nThe example CNN on MNIST-format data (1500 train images, 28x28), CPU, {epochs} epochs, "
              f"batch 32 per worker, image {image}")
        print("| workers | epoch 1 s | median later epoch s | test accuracy |")
        print("|---|---|---|---|")
        for n, s in ((1, one), (2, two)):
            later = s["epoch_seconds"][1:] or s["epoch_seconds"]
            print(f"| {n} | {s['epoch_seconds'][0]:.2f} | {median(later):.2f} | {s['test_accuracy']:.3f} |")
        print("(reported, not a goal: the two workers share this machine's cores and all-reduce over a bridge)")
    finally:
        for name in (f"gpuhub-bench-{tag}-w0", f"gpuhub-bench-{tag}-w1"):
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        network.remove()
        volume.remove(force=True)


# --- 3. gang leasing under contention ----------------------------------------------------


BASELINE_TIMEOUT = 5.0


def bench_ledger(rounds: int) -> None:
    print("\nGang leasing under contention: 8 clusters of 2 x 1 GPU + 16 single-GPU requests at once, "
          f"4 GPUs, SQLite ledger, each holding its GPUs 20 ms; {rounds} rounds of each way.\n"
          "gang: GPUPool.acquire_gang (one grant per cluster). baseline: each worker's lease asked for "
          f"on its own, one after another (what a cluster without gangs does; a wait gives up after "
          f"{BASELINE_TIMEOUT:g} s, so a deadlock ends)")
    print("| way | round | served | clusters seen holding part of their GPUs | deadlocks (clusters that timed out) "
          "| most GPUs lent | cluster wait median / p95 s | single wait median / p95 s | all done s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for way, n in [(w, n) for w in ("gang", "baseline") for n in range(rounds)]:
        contention_round(way, n)


def contention_round(way: str, n: int) -> None:
    """One round of part 3, the gang way or the baseline's, printed as a table row."""
    from spawner.inventory import SimulatedInventory
    from spawner.pool import GPUPool, WaitTimeout

    with tempfile.TemporaryDirectory() as tmp:
        pool = GPUPool(inventory=SimulatedInventory(count=4, host="bench"),
                       db_url=f"sqlite:///{tmp}/ledger.sqlite", poll_interval=0.05)
        pool.sync_inventory()
        waits: dict[str, list[float]] = {"cluster": [], "single": []}
        partial, peak, failures = set(), [0], []

        async def cluster(name):
            began = time.perf_counter()
            if way == "gang":
                leases = await pool.acquire_gang("u", name, 1, 2, timeout=60)
            else:
                leases = []
                try:
                    for i in range(2):
                        leases.append(await pool.acquire("u", f"{name}/worker-{i}", 1, timeout=BASELINE_TIMEOUT))
                except WaitTimeout:
                    pool.release_all([l.id for l in leases], "job-failed")
                    raise
            waits["cluster"].append(time.perf_counter() - began)
            if way == "gang" and (len(leases) != 2 or len({l.started_at for l in leases}) != 1):
                partial.add(name)
            await asyncio.sleep(0.02)
            pool.release_all([l.id for l in leases], "job-finished")

        async def single(name):
            began = time.perf_counter()
            lease = await pool.acquire("u", name, 1, timeout=60)
            waits["single"].append(time.perf_counter() - began)
            await asyncio.sleep(0.02)
            pool.release(lease.id)

        async def watch(done):
            while not done.is_set():
                active = pool.leases()
                peak[0] = max(peak[0], sum(len(l.gpu_uuids) for l in active))
                gangs: dict[str, int] = {}
                for l in active:
                    if "/worker-" in l.server_name:
                        base = l.server_name.rsplit("/", 1)[0]
                        gangs[base] = gangs.get(base, 0) + 1
                partial.update(base for base, k in gangs.items() if k != 2)
                await asyncio.sleep(0.002)

        async def main():
            done = asyncio.Event()
            watcher = asyncio.ensure_future(watch(done))
            tasks = [cluster(f"job/c{i}") for i in range(8)] + [single(f"s{i}") for i in range(16)]
            began = time.perf_counter()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            failures.extend(r for r in results if isinstance(r, BaseException))
            elapsed = time.perf_counter() - began
            done.set()
            await watcher
            return elapsed

        elapsed = asyncio.run(main())
        served = len(waits["cluster"]) + len(waits["single"])
        c, s = waits["cluster"], waits["single"]
        c = c or [float("nan")]
        print(f"| {way} | {n + 1} | {served}/24 | {len(partial)} | {len(failures)} | {peak[0]}/4 | "
              f"{median(c):.3f} / {percentile(c, 0.95):.3f} | {median(s):.3f} / {percentile(s, 0.95):.3f} | "
              f"{elapsed:.2f} |")
        assert not pool.leases() and not pool.queue()
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--image", default="", help="the MKL image (default gpuhub/notebook-mkl:latest)")
    parser.add_argument("--skip-training", action="store_true", help="leave out part 2 (minutes of CPU)")
    parser.add_argument("--only-ledger", action="store_true", help="only part 3 (no Docker)")
    args = parser.parse_args()
    bench_ledger(args.rounds)
    if args.only_ledger:
        return
    client, minimal, network = environment()
    image = args.image or "gpuhub/notebook-mkl:latest"
    bench_startup(client, image, network, args.rounds)
    if not args.skip_training:
        bench_training(client, image, args.epochs)


if __name__ == "__main__":
    main()
