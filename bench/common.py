"""What the benchmarks share with the test fixtures: dockerd, the notebook image, a bridge,
and real hubs made by tests/fixtures/hub.py (so a benchmark measures the tested setup)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NETWORK = "gpuhub-bench"


def run(cmd: list[str]) -> str:
    return subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def environment(image: str | None = None):
    """(docker client, notebook image, network name), starting/building what is missing."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception:
        subprocess.run(["bash", "devservices/docker-up.sh"], cwd=REPO, check=True)
        client = docker.from_env()
    if not image:
        base = run(["bash", "images/build-base.sh"]).splitlines()[-1]
        image = run([sys.executable, "images/build.py", "--variant", "minimal",
                     "--base-image", base]).splitlines()[-1]
    try:
        client.networks.get(NETWORK)
    except docker.errors.NotFound:
        client.networks.create(NETWORK, driver="bridge")
    from tests.fixtures.hub import ensure_chp

    ensure_chp()
    return client, image, NETWORK


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values)
