#!/usr/bin/env python3
"""Hub shutdown time: SIGTERM to the hub -> the hub process has exited.

    .venv/bin/python bench/bench_shutdown.py [--rounds 3]

Real hubs (JupyterHub + CHP, no notebook servers), each stopped with SIGTERM
as systemd or Ctrl-C in `make demo` would.  Arms, taking turns in one run:

  culling off                  no services: the floor
  culling on (spawner.culling) the project's culler service
  stock jupyterhub-idle-culler the same service slot running the upstream
                               culler unchanged (what spawner.culling did
                               before it handled signals itself)

Each arm runs with the hub started normally and with SIGINT ignored (as a
background job of a shell script starts it; the services inherit that, and
JupyterHub stops services with SIGINT, escalating only after 30 s).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import environment  # noqa: E402
from devservices.hub import cleanup_hub, prepare_hub  # noqa: E402

STOCK_CULLER = """
import sys
for service in c.JupyterHub.services:
    if service["name"] == "idle-culler":
        service["command"] = [sys.executable, "-m", "jupyterhub_idle_culler", "--timeout=900", "--cull-every=1"]
"""

ARMS = {
    "culling off": ({"GPUHUB_CULL": "false"}, ""),
    "culling on (spawner.culling)": ({"GPUHUB_CULL": "true", "GPUHUB_CULL_EVERY": "1"}, ""),
    "stock jupyterhub-idle-culler": ({"GPUHUB_CULL": "true", "GPUHUB_CULL_EVERY": "1"}, STOCK_CULLER),
}


def shutdown_seconds(client, network: str, workdir: Path, env: dict, extra: str, ignore_sigint: bool) -> float:
    directory = Path(tempfile.mkdtemp(dir=workdir))
    hub = prepare_hub(directory, "gpuhub/none:none", network, extra_config=extra, env=env)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore_sigint else None
    try:
        hub.start()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    try:
        time.sleep(3)  # services up, a few cull rounds
        began = time.perf_counter()
        hub.process.send_signal(signal.SIGTERM)
        hub.process.wait(120)
        return time.perf_counter() - began
    finally:
        cleanup_hub(hub, client)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    client, _, network = environment("gpuhub/none:none")
    samples: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuhub-bench-stop-") as tmp:
        for _ in range(args.rounds):
            for ignore in (False, True):
                for label, (env, extra) in ARMS.items():
                    samples.setdefault((label, ignore), []).append(
                        shutdown_seconds(client, network, Path(tmp), env, extra, ignore))
    print(f"\nSIGTERM -> hub exited, {args.rounds} rounds, medians in seconds\n")
    print("| hub | started normally | started with SIGINT ignored |")
    print("|---|---:|---:|")
    for label in ARMS:
        a = statistics.median(samples[(label, False)])
        b = statistics.median(samples[(label, True)])
        print(f"| {label} | {a:.2f} | {b:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
