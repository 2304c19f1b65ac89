#!/usr/bin/env python3
"""gpu-swarm on a real 2-worker Swarm made on this machine (tests/fixtures/swarm.py).

1. REST POST -> ready: `gpu-swarm` (1 GPU) versus dockerspawner's SwarmSpawner,
   same cluster, image and overlay, alternating in one run.  The baseline
   differs from stock SwarmSpawner in two lines only, which this harness
   needs: the hub runs outside Docker's DNS, so it reaches the task at its
   overlay address, and services use `dnsrr` (this kernel has no IPVS).
2. A storm: N users against the 4 GPUs of 2 nodes, POSTs 0.3 s apart, each
   holds its server a moment: all served, in queue order (the waiters'
   order in the ledger's queue, watched during the storm, against the order
   their leases started), no GPU lent twice.

    .venv/bin/python bench/bench_swarm.py [--rounds 5] [--storm-users 16]
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
from devservices.postgres import start_postgres  # noqa: E402
from devservices.swarm import _docker0_gateway, start_swarm, stop_swarm  # noqa: E402
from devservices.swarm_hub import cleanup_swarm_hub, prepare_swarm_hub  # noqa: E402
from devservices.tcp_proxy import BlackholeProxy  # noqa: E402

PLAIN_SWARMSPAWNER = """
from dockerspawner import SwarmSpawner
from spawner.engines.swarm.tasks import task_ip

class TaskAddressSwarmSpawner(SwarmSpawner):
    async def get_ip_and_port(self):
        return task_ip(await self.get_task(), self.network_name), self.port

c.JupyterHub.spawner_class = TaskAddressSwarmSpawner
c.SwarmSpawner.image = {image!r}
c.SwarmSpawner.network_name = {network!r}
c.SwarmSpawner.use_internal_ip = True
c.SwarmSpawner.pull_policy = "skip"
c.SwarmSpawner.prefix = {prefix!r}
c.SwarmSpawner.extra_endpoint_spec = {{"mode": "dnsrr"}}
c.SwarmSpawner.extra_placement_spec = {{"constraints": ["node.role==worker"]}}
"""

GPU = {"profile": "tf-gpu-1"}


def bench_post_to_ready(swarm, pg, forward, image, work: Path, rounds: int, client) -> None:
    gpu_hub = prepare_swarm_hub(swarm, pg, forward.port, image, work / "gpu", index=1)
    plain_hub = prepare_swarm_hub(swarm, pg, forward.port, image, work / "plain", index=2)
    plain_hub.config_file.write_text(plain_hub.config_file.read_text() + PLAIN_SWARMSPAWNER.format(
        image=image, network=swarm.network, prefix=plain_hub.prefix))
    try:
        alternate_spawns((("gpu-swarm (1 GPU)", gpu_hub, GPU), ("SwarmSpawner", plain_hub, {})), rounds,
                         "REST POST -> ready on a 2-worker Swarm")
    finally:
        cleanup_swarm_hub(gpu_hub, client)
        cleanup_swarm_hub(plain_hub, client)


def bench_storm(swarm, pg, forward, image, work: Path, users: int, hold: float, client) -> None:
    hub = prepare_swarm_hub(swarm, pg, forward.port, image, work / "storm", index=3,
                            env={"GPUHUB_LEASE_WAIT_TIMEOUT": "600"})
    hub.start()
    names = [f"storm{i:02d}" for i in range(users)]
    for name in names:
        hub.create_user(name)
    errors: list[str] = []
    posted: dict[str, float] = {}

    def one(name: str) -> None:
        storm_user(hub, name, GPU, hold, posted, errors)

    # The ledger's queue order: each waiter's id, watched while the storm runs.
    waiter_ids: dict[str, int] = {}
    watching = threading.Event()

    def watch() -> None:
        ledger = hub.ledger()
        while not watching.is_set():
            for waiter in ledger.queue():
                waiter_ids.setdefault(waiter.user, waiter.id)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    began = time.perf_counter()
    threads = []
    for name in names:
        threads.append(threading.Thread(target=one, args=(name,)))
        threads[-1].start()
        time.sleep(0.3)  # a definite queue order: the POST order
    for t in threads:
        t.join(900)
    total = time.perf_counter() - began
    watching.set()
    watcher.join()
    try:
        history = [lease for lease in hub.ledger().history() if lease.user in posted]
        # Pairs of queued users served in the opposite order of their places in the queue.
        started = [lease.user for lease in sorted(history, key=lambda lease: lease.started_at)
                   if lease.user in waiter_ids]
        out_of_order = sum(1 for i, u in enumerate(started) for v in started[i + 1:]
                           if waiter_ids[v] < waiter_ids[u])
        print_storm(f"Storm: {users} users, POSTs 0.3 s apart, against 4 GPUs on 2 nodes; each holds "
                    f"its server {hold:.0f} s", history, posted, total, errors,
                    {"nodes": len({lease.host for lease in history}), "queued": len(waiter_ids),
                     "out of queue order": out_of_order})
    finally:
        cleanup_swarm_hub(hub, client)


def main() -> int:
    args = spawn_bench_arguments(__doc__)
    client, image, _ = environment()
    swarm = start_swarm()
    pg = start_postgres()
    forward = BlackholeProxy(pg.port, listen_host=_docker0_gateway())
    try:
        swarm.load_image(image)
        with tempfile.TemporaryDirectory(prefix="gpuhub-bench-swarm-") as tmp:
            work = Path(tmp)
            for sub in ("gpu", "plain", "storm"):
                (work / sub).mkdir()
            bench_post_to_ready(swarm, pg, forward, image, work, args.rounds, client)
            if not args.skip_storm:
                bench_storm(swarm, pg, forward, image, work, args.storm_users, args.hold, client)
    finally:
        forward.close()
        pg.stop()
        stop_swarm(swarm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
