"""What the benchmarks share with the test fixtures: dockerd, the notebook image, a bridge,
and real hubs made by devservices/hub.py (so a benchmark measures the tested setup)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
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
    from devservices.hub import ensure_chp

    ensure_chp()
    return client, image, NETWORK


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def double_lent(history) -> int:
    """How many times a GPU's lease began before the previous lease of that GPU ended."""
    by_gpu: dict[tuple[str, str], list] = {}
    for lease in history:
        for uuid in lease.gpu_uuids:
            by_gpu.setdefault((lease.host, uuid), []).append((lease.started_at, lease.ended_at))
    overlaps = 0
    for spans in by_gpu.values():
        spans.sort()
        overlaps += sum(1 for a, b in zip(spans, spans[1:]) if a[1] is None or a[1] > b[0])
    return overlaps


def spawn_bench_arguments(doc: str):
    """The options of the spawn benchmarks (rounds, and the storm's users and hold time)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--storm-users", type=int, default=16)
    parser.add_argument("--hold", type=float, default=2.0, help="seconds each storm user keeps its server")
    parser.add_argument("--skip-storm", action="store_true")
    return parser.parse_args()


def time_to_ready(hub, user: str, options: dict) -> float:
    began = time.perf_counter()
    r = hub.api("POST", f"/users/{user}/server", json=options)
    assert r.status_code in (201, 202), r.text
    while True:
        server = hub.server_model(user)
        if server and server.get("ready"):
            return time.perf_counter() - began
        assert server is not None, f"spawn failed:\n{hub.log_tail()}"
        time.sleep(0.05)


def lease_ended(hub, user: str) -> bool:
    """Whether `user` holds no active lease in the hub's ledger: their GPUs are lendable again."""
    return not any(lease.user == user for lease in hub.ledger().leases())


def timed_stop(hub, user: str, lends: bool) -> tuple[float, float | None]:
    """DELETE a server: (seconds until the hub reports it gone, seconds until its GPUs are
    lendable again in the ledger, watched every 20 ms; None for an arm that lends none)."""
    began = time.perf_counter()
    r = hub.api("DELETE", f"/users/{user}/server")
    assert r.status_code in (202, 204), f"{r.status_code}: {r.text}"
    freed = None
    if lends:
        deadline = time.monotonic() + 60
        while not lease_ended(hub, user):
            assert time.monotonic() < deadline, f"the lease of {user} did not end:\n{hub.log_tail()}"
            time.sleep(0.02)
        freed = time.perf_counter() - began
    hub.wait_stopped(user)
    return time.perf_counter() - began, freed


def alternate_spawns(arms, rounds: int, title: str) -> None:
    """Spawn (POST -> ready) and stop on each arm in turn, `rounds` times after a warm-up;
    print medians and the ratio to the last arm, the baseline.  arms: (label, hub, options);
    an arm whose options name a GPU profile also gets DELETE -> GPU lendable (the ledger's view)."""
    for _, hub, options in arms:
        hub.start()
        hub.create_user("bench")
        time_to_ready(hub, "bench", options)  # warm-up: the first creation pays one-off costs
        hub.stop_server("bench")
    results: dict[str, list[float]] = {label: [] for label, _, _ in arms}
    stops: dict[str, list[float]] = {label: [] for label, _, _ in arms}
    frees: dict[str, list[float]] = {label: [] for label, _, _ in arms}
    for _ in range(rounds):
        for label, hub, options in arms:
            results[label].append(time_to_ready(hub, "bench", options))
            stop, freed = timed_stop(hub, "bench", lends="gpu" in str(options.get("profile", "")))
            stops[label].append(stop)
            if freed is not None:
                frees[label].append(freed)
    base = statistics.median(results[arms[-1][0]])
    width = max(len(label) for label, _, _ in arms) + 2
    print(f"\n{title}, {rounds} alternating rounds (seconds)")
    print(f"{'spawner':{width}} {'median':>8} {'min':>8} {'max':>8} {'ratio':>7} {'stop med':>9} "
          f"{'GPU free med':>13} {'max':>6}")
    for label, values in results.items():
        med = statistics.median(values)
        free = (f"{statistics.median(frees[label]):13.2f} {max(frees[label]):6.2f}" if frees[label]
                else f"{'-':>13} {'-':>6}")
        print(f"{label:{width}} {med:8.2f} {min(values):8.2f} {max(values):8.2f} {med / base:7.3f} "
              f"{statistics.median(stops[label]):9.2f} {free}")


def print_storm(title: str, history, posted: dict[str, float], total: float, errors: list[str],
                extra: dict[str, object] | None = None) -> None:
    """The storm's table: users, time until all ran, lease waits, leases, `extra` columns,
    double lending (from the ledger's history) and errors."""
    waits = [lease.started_at.timestamp() - posted[lease.user] for lease in history if lease.user in posted]
    row = {"users": len(posted), "all run (s)": f"{total:.1f}",
           "wait p50 (s)": f"{percentile(waits, 0.5):.2f}", "wait p99 (s)": f"{percentile(waits, 0.99):.2f}",
           "leases": len(history), **(extra or {}), "double lent": double_lent(history), "errors": len(errors)}
    print(f"\n{title}")
    print(" ".join(f"{key:>{len(key) + 1}}" for key in row))
    print(" ".join(f"{value!s:>{len(key) + 1}}" for key, value in row.items()))
    for e in errors:
        print("  error:", e[:300])


def storm_user(hub, name: str, options: dict, hold: float, posted: dict[str, float], errors: list[str]) -> None:
    """One storm user: POST, wait until ready, hold the server `hold` s, stop; errors collected."""
    try:
        posted[name] = time.time()
        r = hub.api("POST", f"/users/{name}/server", json=options, timeout=700)
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(name, timeout=700)
        time.sleep(hold)
        hub.stop_server(name, timeout=120)
    except Exception as exc:  # reported in the table
        errors.append(f"{name}: {exc}")
