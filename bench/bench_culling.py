"""Benchmark: from the idle culler's DELETE to the GPU being leasable again.

    .venv/bin/python bench/bench_culling.py [--rounds 5]

Starts a real hub (one simulated GPU, the real jupyterhub-idle-culler with a
GPU timeout of a few seconds), then, each round, spawns a GPU server, leaves
it idle and waits for the culler.  The clock starts at the culler's
"Culling server ..." log line, written just before it sends DELETE to the
hub, and stops when another client of the ledger can lease the GPU (a real
try_acquire, released at once).  The baseline, run in the same process, is a
user's own REST DELETE to the same point.  Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment, percentile  # noqa: E402
from devservices.hub import Hub, cleanup_hub, prepare_hub  # noqa: E402
from spawner.pool import GPUPool  # noqa: E402

CULL_LINE = re.compile(r"\[I (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) GPUIdleCuller \S+\] Culling server (\S+) ")


def start_hub(client, image: str, network: str, directory: Path) -> Hub:
    """A hub with one simulated GPU and the real culler on a GPU timeout of seconds."""
    hub = prepare_hub(directory, image, network, env={
        "GPUHUB_SIMULATED_GPUS": "1",
        "GPUHUB_CULL": "true",
        "GPUHUB_CULL_EVERY": "1",
        "GPUHUB_CULL_TIMEOUT_GPU": "10",  # longer than a loaded machine's spawn
        "GPUHUB_CULL_TIMEOUT_CPU": "600",
    })
    return hub.start()


def wait_leasable(pool: GPUPool, timeout: float = 120) -> float:
    """Poll until another client can lease the GPU; the wall-clock time it could."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pool.counts().get("free", 0) >= 1:
            lease = pool.try_acquire("bench-probe", "", 1)
            if lease is not None:
                at = time.time()
                pool.release(lease.id, "stopped")
                return at
        time.sleep(0.01)
    raise TimeoutError("the GPU did not become leasable")


def cull_logged_at(hub: Hub, user: str, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in hub.log_path.read_text(errors="replace").splitlines():
            m = CULL_LINE.search(line)
            if m and m.group(2) == user:
                return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        time.sleep(0.1)
    raise TimeoutError(f"no cull of {user} in the log")


def container_stop_seconds(hub: Hub, user: str) -> float:
    """From the spawner's `Stopping container` to its `Released GPU lease`, from the hub log:
    the part of the path spent waiting for the single-user server to exit."""
    stamp = r"\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) "
    text = hub.log_path.read_text(errors="replace")
    begin = re.search(stamp + r".*Stopping container " + re.escape(f"{hub.prefix}-{user}") + " ", text)
    end = re.search(stamp + r".*Released GPU lease \d+ of " + re.escape(user) + " ", text)
    if not (begin and end):
        return float("nan")
    parse = lambda m: datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()  # noqa: E731
    return parse(end) - parse(begin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    client, image, network = environment(os.environ.get("GPUHUB_BENCH_IMAGE"))
    directory = Path(tempfile.mkdtemp(prefix="bench-culling-"))
    hub = start_hub(client, image, network, directory)
    pool = hub.ledger()
    culled, stopped = [], []
    culled_docker, stopped_docker = [], []
    try:
        for i in range(args.rounds):
            user = f"cull{i}"
            hub.create_user(user)
            hub.start_server(user, {"profile": "tf-gpu-1"})
            free_at = wait_leasable(pool)  # the culler stops it: nobody touches it
            culled.append(free_at - cull_logged_at(hub, user))
            culled_docker.append(container_stop_seconds(hub, user))

            # Baseline: the user stops it themself, right away (before the culler would).
            user = f"stop{i}"
            hub.create_user(user)
            hub.start_server(user, {"profile": "tf-gpu-1"})
            sent = time.time()
            r = hub.api("DELETE", f"/users/{user}/server", token=hub.user_token(user))
            assert r.status_code in (202, 204), r.text
            stopped.append(wait_leasable(pool) - sent)
            stopped_docker.append(container_stop_seconds(hub, user))
            print(f"round {i + 1}/{args.rounds}: culled {culled[-1]:.3f} s, user stop {stopped[-1]:.3f} s",
                  file=sys.stderr)
    finally:
        cleanup_hub(hub, client)

    base = statistics.median(stopped)
    print()
    print("GPU leasable again after a stop (1 simulated GPU, real hub, culler, dockerd)")
    print(f"{'path':<30} {'rounds':>6} {'median s':>9} {'p90 s':>7} {'vs user stop':>13} "
          f"{'of which container exit s':>26}")
    for name, values, docker_part in (("culler DELETE -> leasable", culled, culled_docker),
                                      ("user REST DELETE -> leasable", stopped, stopped_docker)):
        med = statistics.median(values)
        print(f"{name:<30} {len(values):>6} {med:>9.3f} {percentile(values, 0.9):>7.3f} {med / base:>12.2f}x "
              f"{statistics.median(docker_part):>26.3f}")
    print("goal: culler DELETE -> leasable, median < 2 s")


if __name__ == "__main__":
    main()
