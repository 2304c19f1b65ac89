#!/usr/bin/env python3
"""Jobs and action scripts on a real 2-worker Swarm made on this machine (tests/fixtures/swarm.py).

1. A job: REST POST -> its task running, versus `docker service create` of the same image and
   command pinned to the same node (restart none, the same GPU in NVIDIA_VISIBLE_DEVICES),
   through the same manager's API, alternating, one run of `--rounds` each.  Two more rows
   say what a job's isolation costs by itself (a job without `job_network` is on an internal
   overlay, Swarm having no "none"): the same service on an internal overlay made for it
   (removed after), and on one made once and kept.
2. A script over 4 servers on 2 nodes (through each server's Jupyter server, bounded and
   audited), versus the same script run by `docker exec` on each node directly (4 at once).

    .venv/bin/python bench/bench_swarm_product.py [--rounds 5]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment  # noqa: E402
from devservices.postgres import start_postgres  # noqa: E402
from devservices.swarm import _docker0_gateway, start_swarm, stop_swarm  # noqa: E402
from devservices.swarm_hub import cleanup_swarm_hub, prepare_swarm_hub, profiles_config  # noqa: E402
from devservices.tcp_proxy import BlackholeProxy  # noqa: E402

SCRIPT = "echo ran as $(id -u); cat /proc/loadavg"
ADMIN = {"GPUHUB_ADMIN_USERS": "ada", "GPUHUB_POOL_EXEC_USERS": "ada", "GPUHUB_POOL_PAGE": "true"}


def table(title: str, results: dict[str, list[float]]) -> None:
    base = statistics.median(list(results.values())[-1])
    width = max(len(label) for label in results) + 2
    print(f"\n{title} (seconds)")
    print(f"{'':{width}} {'median':>8} {'min':>8} {'max':>8} {'ratio':>7}")
    for label, values in results.items():
        med = statistics.median(values)
        print(f"{label:{width}} {med:8.3f} {min(values):8.3f} {max(values):8.3f} {med / base:7.3f}")


def until_task_runs(api, service: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = api.tasks(filters={"service": service})
        except Exception:
            tasks = []
        states = [(t.get("Status") or {}).get("State") for t in tasks]
        if "running" in states:
            return
        if any(s in ("failed", "rejected", "complete") for s in states):
            raise RuntimeError(f"{service}: {states}")
        time.sleep(0.02)
    raise RuntimeError(f"{service} did not run within {timeout} s")


def page(hub, method: str, path: str, token: str, **kwargs):
    import requests

    return requests.request(method, f"{hub.url}/services/gpu-pool/{path}", timeout=120,
                            headers={"Authorization": f"token {token}"}, **kwargs)


def bench_jobs(hub, swarm, image: str, rounds: int, token: str) -> None:
    import docker
    from docker.types import ContainerSpec, Placement, RestartPolicy, TaskTemplate

    api = docker.APIClient(timeout=60)
    t4 = next(n for n in swarm.nodes if n.labels["gpu.model"] == "t4")
    results: dict[str, list[float]] = {"job (POST -> task running)": [], "docker service create": []}

    def job_round() -> float:
        began = time.perf_counter()
        r = page(hub, "POST", "api/jobs", token, json={"profile": "t4", "command": ["sleep", "60"]})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        until_task_runs(api, f"{hub.prefix}-job-{job_id}")
        took = time.perf_counter() - began
        assert page(hub, "DELETE", f"api/jobs/{job_id}", token).json()["state"] == "cancelled"
        return took

    def plain_round(i: int, network: str | None = None, make_network: bool = False) -> float:
        name = f"{hub.prefix}-plain-{i}"
        began = time.perf_counter()
        if make_network:  # what isolation costs: an internal overlay made for this one task
            network = f"{name}-isolated"
            api.create_network(network, driver="overlay", attachable=True, internal=True)
        api.create_service(TaskTemplate(
            container_spec=ContainerSpec(image, args=["sleep", "60"], user="1000:100", cap_drop=["ALL"],
                                         env={"NVIDIA_VISIBLE_DEVICES": t4.gpus[0]}),
            restart_policy=RestartPolicy(condition="none"), networks=[network] if network else None,
            placement=Placement(constraints=[f"node.hostname=={t4.hostname}"])), name=name)
        until_task_runs(api, name)
        took = time.perf_counter() - began
        api.remove_service(name)
        if make_network:
            remove_network(api, network)
        return took

    kept = f"{hub.prefix}-plain-kept-isolated"  # an internal overlay that outlives its tasks
    api.create_network(kept, driver="overlay", attachable=True, internal=True)
    rows = {"docker service create, on a new internal overlay": lambda i: plain_round(1000 + i, make_network=True),
            "docker service create, on a kept internal overlay": lambda i: plain_round(2000 + i, network=kept)}
    results.update({label: [] for label in rows})
    results["docker service create"] = results.pop("docker service create")  # the baseline: last
    try:
        job_round(), plain_round(0)  # warm-up: first creations pay one-off costs
        for fn in rows.values():
            fn(0)
        for i in range(rounds):
            results["job (POST -> task running)"].append(job_round())
            for label, fn in rows.items():
                results[label].append(fn(i + 1))
            results["docker service create"].append(plain_round(i + 1))
    finally:
        remove_network(api, kept)
    table(f"A job on Swarm, {rounds} alternating rounds, pinned to one node", results)


def remove_network(api, network: str, timeout: float = 60) -> None:
    """Remove an overlay once its last task has left it (Swarm takes a moment after the service)."""
    import docker.errors

    deadline = time.monotonic() + timeout
    while True:
        try:
            api.remove_network(network)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def bench_scripts(hub, swarm, rounds: int, token: str) -> None:
    users = ["s1", "s2", "s3", "s4"]
    for user in users:
        hub.create_user(user)
    profiles = ["a100", "a100", "t4", "t4"]
    threads = [threading.Thread(target=hub.start_server, args=(u, {"profile": p})) for u, p in zip(users, profiles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    containers = [swarm.task_container(f"{hub.prefix}-{u}") for u in users]
    assert all(containers), containers
    results: dict[str, list[float]] = {"gpu-pool exec (4 servers, 2 nodes)": [], "docker exec on each node": []}

    def through_hub() -> float:
        began = time.perf_counter()
        r = page(hub, "POST", "api/exec", token, json={"script": SCRIPT, "users": users, "timeout": 30})
        took = time.perf_counter() - began
        assert r.status_code == 200 and all(x["exit_code"] == 0 for x in r.json()["results"]), r.text
        return took

    def direct() -> float:
        began = time.perf_counter()
        runs = [threading.Thread(target=node.docker, args=("exec", "-u", "1000:100", cid, "sh", "-c", SCRIPT))
                for node, cid in containers]
        for t in runs:
            t.start()
        for t in runs:
            t.join(60)
        return time.perf_counter() - began

    through_hub(), direct()
    for _ in range(rounds):
        results["gpu-pool exec (4 servers, 2 nodes)"].append(through_hub())
        results["docker exec on each node"].append(direct())
    table(f"A script in 4 servers on 2 nodes, {rounds} alternating rounds", results)
    for user in users:
        hub.stop_server(user)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    client, image, _ = environment()
    swarm = start_swarm()
    pg = start_postgres()
    forward = BlackholeProxy(pg.port, listen_host=_docker0_gateway())
    try:
        swarm.load_image(image)
        with tempfile.TemporaryDirectory(prefix="gpuhub-bench-swarm-product-") as tmp:
            hub = prepare_swarm_hub(swarm, pg, forward.port, image, Path(tmp), profiles_config(image), env=ADMIN)
            try:
                hub.start()
                hub.create_user("ada")
                token = hub.user_token("ada")
                deadline = time.monotonic() + 60
                while page(hub, "GET", "api/gpus", token).status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.5)
                bench_jobs(hub, swarm, image, args.rounds, token)
                bench_scripts(hub, swarm, args.rounds, token)
            finally:
                cleanup_swarm_hub(hub, client)
    finally:
        forward.close()
        pg.stop()
        stop_swarm(swarm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
