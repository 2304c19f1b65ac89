#!/usr/bin/env python3
"""The user's first minute: REST POST -> the first TensorFlow result, phase by phase.

    .venv/bin/python bench/bench_first_minute.py [--rounds 5] [--baseline-rev 7c70838]

Three real hubs (real dockerd, CHP, JupyterHub, the GPU spawner with one
simulated GPU) take turns, one spawn each per round, so machine load hits
them alike:

  new            today's TensorFlow MKL image (images/build.py), this hub
  old image      the same image built the old way, from the images/ folder of
                 `--baseline-rev` (the commit before bytecode was shipped), this hub
  old image,     that image with the hub as it was: no readiness wait at the
  old hub        end of start() (spawner.engines.common.readiness.MAX_WAIT = 0 in its config),
                 so JupyterHub's own backoff polling notices the server

Each round, for user `bench` on the `tf-gpu-1` profile:

  lease          POST -> the lease's start in the ledger
  container      lease -> Docker's State.StartedAt of the user's container
  server up      container start -> the single-user server answers HTTP
                 (polled every 50 ms from this machine, at the address the hub uses)
  hub notices    server up -> the hub's REST model says ready
  kernel start   POST /api/kernels through the proxy -> a first cell (`1`) returns
  tf import      a cell `import tensorflow as tf` returns
  first op       a cell `tf.reduce_sum(tf.ones((1000, 1000)))` returns

and the total from POST to the first op's result.  Prints medians per phase
for each arm and their ratio to the new one, and the two images' sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment  # noqa: E402
from devservices.hub import cleanup_hub, prepare_hub  # noqa: E402
from devservices.kernels import Kernel  # noqa: E402

# The last commit whose images shipped no bytecode.
BASELINE_REV = "7c70838"
BASELINE_REPO = "gpuhub/baseline-notebook"
PHASES = ["lease", "container", "server up", "hub notices", "kernel start", "tf import", "first op"]
USER = "bench"


def run(cmd: list[str], **kw) -> str:
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def build_images(baseline_rev: str) -> tuple[str, str]:
    """(new image, old-way image), both MKL, on the same Debian base."""
    base = run(["bash", "images/build-base.sh"])
    new = run([sys.executable, "images/build.py", "--variant", "mkl", "--base-image", base])
    with tempfile.TemporaryDirectory(prefix="bench-old-images-") as tmp:
        archive = subprocess.run(["git", "archive", baseline_rev, "images"], cwd=REPO, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        # The old build.py, its own Dockerfile and requirements; the wheels cache is shared.
        old = run([sys.executable, f"{tmp}/images/build.py", "--variant", "mkl", "--base-image", base,
                   "--repo", BASELINE_REPO], env={**os.environ, "GPUHUB_CACHE": str(REPO / ".cache")})
    return new, old


def image_size_gb(ref: str) -> float:
    return int(run(["docker", "image", "inspect", "--format", "{{.Size}}", ref])) / 1e9


def docker_time(value: str) -> float:
    """Docker's RFC 3339 nanosecond timestamps as epoch seconds."""
    head, _, frac = value.rstrip("Z").partition(".")
    stamp = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return stamp + (float("0." + frac) if frac else 0.0)


def epoch(dt: datetime) -> float:
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


class ServerWatcher(threading.Thread):
    """Polls the user's container, as the hub would reach it, until it answers HTTP."""

    def __init__(self, client, hub, network: str):
        super().__init__(daemon=True)
        self.client, self.hub, self.network = client, hub, network
        self.up_at: float | None = None
        self.started_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        name = f"{self.hub.prefix}-{USER}"
        url = None
        session = requests.Session()
        while not self.stop.is_set():
            if url is None:
                try:
                    container = self.client.containers.get(name)
                    ip = container.attrs["NetworkSettings"]["Networks"][self.network]["IPAddress"]
                    if ip and container.attrs["State"]["Running"]:
                        url = f"http://{ip}:8888/user/{USER}/"
                except Exception:
                    pass
            else:
                try:
                    session.get(url, timeout=0.5, allow_redirects=False)
                    self.up_at = time.time()
                    return
                except requests.RequestException:
                    pass
            time.sleep(0.05)


def one_round(client, hub, network: str) -> dict[str, float]:
    watcher = ServerWatcher(client, hub, network)
    watcher.start()
    posted = time.time()
    r = hub.api("POST", f"/users/{USER}/server", json={"profile": "tf-gpu-1"})
    assert r.status_code in (201, 202), r.text
    while True:
        server = hub.server_model(USER)
        if server and server.get("ready"):
            ready = time.time()
            break
        assert server is not None, f"spawn failed:\n{hub.log_tail()}"
        time.sleep(0.05)
    watcher.join(10)
    watcher.stop.set()
    lease = [x for x in hub.ledger().history(user=USER) if x.active][0]
    container = client.containers.get(f"{hub.prefix}-{USER}")
    started = docker_time(container.attrs["State"]["StartedAt"])
    leased = epoch(lease.started_at)
    up = watcher.up_at or ready

    token = hub._bench_token
    began = time.time()
    kernel = Kernel(hub, USER, token)
    kernel.run("1")
    kernel_ready = time.time()
    kernel.run("import tensorflow as tf")
    imported = time.time()
    kernel.run("tf.reduce_sum(tf.ones((1000, 1000)))")
    done = time.time()
    phases = {
        "lease": leased - posted,
        "container": started - leased,
        "server up": up - started,
        "hub notices": ready - up,
        "kernel start": kernel_ready - began,
        "tf import": imported - kernel_ready,
        "first op": done - imported,
    }
    # POST -> ready plus the kernel's own time (the client's 0.05 s polls excluded).
    phases["total"] = (ready - posted) + (done - began)
    hub.stop_server(USER, timeout=120)
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-rev", default=BASELINE_REV,
                        help="commit whose images/ builds the old-way image (default: %(default)s)")
    parser.add_argument("--new-image", help="use this image instead of building the current one")
    parser.add_argument("--old-image", help="use this image instead of building the baseline one")
    args = parser.parse_args()

    if args.new_image and args.old_image:
        new, old = args.new_image, args.old_image
    else:
        new, old = build_images(args.baseline_rev)
        new, old = args.new_image or new, args.old_image or old
    client, _, network = environment(new)
    old_hub = "import spawner.engines.common.readiness\nspawner.engines.common.readiness.MAX_WAIT = 0.0\n"
    arms = {"new": (new, ""), "old image": (old, ""), "old image, old hub": (old, old_hub)}

    with tempfile.TemporaryDirectory(prefix="gpuhub-bench-fm-") as tmp:
        hubs = {}
        try:
            for i, (label, (image, extra)) in enumerate(arms.items()):
                directory = Path(tmp) / f"hub{i}"
                directory.mkdir()
                hub = prepare_hub(directory, image, network, extra_config=extra,
                                  env={"GPUHUB_SIMULATED_GPUS": "1"})
                hubs[label] = hub
                hub.start()
                hub.create_user(USER)
                hub._bench_token = hub.user_token(USER)
                one_round(client, hub, network)  # warm-up: home volume, page cache
            samples: dict[str, list[dict[str, float]]] = {label: [] for label in arms}
            for n in range(args.rounds):
                for label, hub in hubs.items():
                    samples[label].append(one_round(client, hub, network))
                    print(f"round {n + 1} {label}: total {samples[label][-1]['total']:.2f} s", flush=True)
        finally:
            for hub in hubs.values():
                cleanup_hub(hub, client)

    labels = list(arms)
    print(f"\nPOST -> first TensorFlow result, {args.rounds} alternating rounds, medians in seconds "
          f"(old = {args.baseline_rev})\n")
    print("| phase | " + " | ".join(labels) + " | " + " | ".join(f"{x} / new" for x in labels[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(labels) - 1))
    for phase in PHASES + ["total"]:
        medians = [statistics.median(s[phase] for s in samples[label]) for label in labels]
        name = "**POST -> first TF result**" if phase == "total" else phase
        ratios = [f"{m / medians[0]:.2f}x" if medians[0] > 0 else "-" for m in medians[1:]]
        print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in medians) + " | " + " | ".join(ratios) + " |")
    print(f"\n| image | size (GB) |\n|---|---:|\n| {new} | {image_size_gb(new):.3f} |\n"
          f"| {old} | {image_size_gb(old):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
