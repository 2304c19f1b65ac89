#!/usr/bin/env python3
"""Spawn benchmarks for GPUDockerSpawner, on real hubs and a real dockerd.

1. REST POST -> ready: `gpu-docker` with 1 simulated GPU versus plain
   DockerSpawner, same image, same network, alternating in one run.
2. A storm: N users spawn at once against 4 GPUs, each keeps its server a
   moment and stops it; time until all have run, lease wait p50/p99 (from the
   ledger), and a check of the ledger's history for double lending.

    .venv/bin/python bench/bench_spawner.py [--rounds 5] [--storm-users 16]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import alternate_spawns, environment, print_storm, spawn_bench_arguments, storm_user  # noqa: E402
from devservices.hub import cleanup_hub, prepare_hub  # noqa: E402

PLAIN_DOCKERSPAWNER = """
c.JupyterHub.spawner_class = "docker"
c.DockerSpawner.image = {image!r}
c.DockerSpawner.network_name = {network!r}
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.remove = True
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.prefix = {prefix!r}
"""


def bench_post_to_ready(client, image: str, net: str, workdir: Path, rounds: int) -> None:
    gpu_hub = prepare_hub(workdir / "gpu", image, net)
    plain_hub = prepare_hub(workdir / "plain", image, net)
    plain_hub.config_file.write_text(plain_hub.config_file.read_text() + PLAIN_DOCKERSPAWNER.format(
        image=image, network=net, prefix=plain_hub.prefix))
    try:
        alternate_spawns((("gpu-docker (1 simulated GPU)", gpu_hub, {"profile": "tf-gpu-1"}),
                          ("DockerSpawner", plain_hub, {})), rounds, "REST POST -> ready")
    finally:
        cleanup_hub(gpu_hub, client)
        cleanup_hub(plain_hub, client)


def bench_storm(client, image: str, net: str, workdir: Path, users: int, hold: float) -> None:
    hub = prepare_hub(workdir / "storm", image, net, env={"GPUHUB_LEASE_WAIT_TIMEOUT": "600"})
    hub.start()
    names = [f"storm{i:02d}" for i in range(users)]
    for name in names:
        hub.create_user(name)
    posted: dict[str, float] = {}
    errors: list[str] = []

    def one(name: str) -> None:
        storm_user(hub, name, {"profile": "tf-gpu-1"}, hold, posted, errors)

    began = time.perf_counter()
    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    total = time.perf_counter() - began
    try:
        ledger = hub.ledger()
        history = ledger.history()
        print_storm(f"Storm: {users} users spawn at once against 4 GPUs, each holds its server {hold:.0f} s",
                    history, posted, total, errors)
    finally:
        cleanup_hub(hub, client)


def main() -> int:
    args = spawn_bench_arguments(__doc__)
    client, image, net = environment()
    with tempfile.TemporaryDirectory(prefix="gpuhub-bench-") as tmp:
        work = Path(tmp)
        for sub in ("gpu", "plain", "storm"):
            (work / sub).mkdir()
        bench_post_to_ready(client, image, net, work, args.rounds)
        if not args.skip_storm:
            bench_storm(client, image, net, work, args.storm_users, args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
