"""Benchmark the GPU lease ledger: acquire+release throughput and acquire latency.

    .venv/bin/python bench/bench_pool.py [--ops N] [--backend sqlite|postgresql|both]

For SQLite and PostgreSQL (a throw-away local server, started with the test
fixture's functions), with 1 and 8 processes, each process repeats
try_acquire(1 GPU) + release on a 16-GPU simulated host.  Prints ops/s
(acquire+release pairs per second, all processes together) and the p50/p99
latency of one acquire.  Baselines from the same run: for 1 process, two
empty write transactions per op on the same engine (what the database costs
before the pool does any work); for 8 processes, the p99 of 8 processes
doing only CPU work of the same length per op (the tail the scheduler alone
adds on this machine).

Goals (issue #3): >= 2,000 ops/s in one process on SQLite; p99 < 20 ms with
8 processes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sqlalchemy import text  # noqa: E402

from spawner.inventory import SimulatedInventory  # noqa: E402
from spawner.pool import GPUPool  # noqa: E402

GPUS = 16
WARMUP = 50


def make_pool(url: str) -> GPUPool:
    return GPUPool(inventory=SimulatedInventory(count=GPUS, host="bench"), db_url=url, lock_timeout=30)


def worker(url: str, worker_id: int, ops: int, barrier, results) -> None:
    pool = make_pool(url)
    user = f"user{worker_id}"
    for _ in range(WARMUP):
        pool.release(pool.try_acquire(user, "", 1).id, "stopped")
    barrier.wait()
    latencies = []
    start = time.perf_counter()
    for _ in range(ops):
        t0 = time.perf_counter()
        lease = pool.try_acquire(user, "", 1)
        latencies.append(time.perf_counter() - t0)
        pool.release(lease.id, "stopped")
    end = time.perf_counter()
    pool.close()
    results.put((start, end, latencies))


def cpu_worker(op_s: float, worker_id: int, ops: int, barrier, results) -> None:
    """No database: burn `op_s` of CPU per op, to show the scheduler's own tail."""
    barrier.wait()
    latencies = []
    start = time.perf_counter()
    for _ in range(ops):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < op_s:
            pass
        latencies.append(time.perf_counter() - t0)
    results.put((start, time.perf_counter(), latencies))


def run(target, arg, procs: int, ops: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=target, args=(arg, i, ops, barrier, results)) for i in range(procs)]
    for w in workers:
        w.start()
    out = [results.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    wall = max(e for _, e, _ in out) - min(s for s, _, _ in out)
    lat = sorted(x for _, _, l in out for x in l)
    return {
        "ops": len(lat),
        "ops_s": len(lat) / wall,
        "p50": statistics.median(lat) * 1000,
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def floor(url: str, ops: int) -> float:
    """Seconds per op of two empty write transactions (BEGIN IMMEDIATE / advisory lock)."""
    pool = make_pool(url)
    pool.counts()

    def empty(conn):
        conn.execute(text("SELECT 1"))

    for _ in range(WARMUP):
        pool._write(empty)
    t0 = time.perf_counter()
    for _ in range(ops):
        pool._write(empty)
        pool._write(empty)
    pool.close()
    return (time.perf_counter() - t0) / ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="acquire+release pairs per process (1 process)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--pg-fast", action="store_true",
                        help="also run PostgreSQL with fsync off: the pool's cost without this disk's fsync time")
    args = parser.parse_args()

    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if "postgresql" in backends and args.pg_fast:
        backends.append("postgresql-fast")
    rows = []
    tmp = tempfile.mkdtemp(prefix="bench-pool-")
    server = None
    try:
        for backend in backends:
            if backend == "sqlite":
                url = f"sqlite:///{tmp}/ledger.sqlite"
                note = "WAL, synchronous=NORMAL"
            else:
                from devservices.postgres import create_database, start_postgres

                durable = backend == "postgresql"
                server = start_postgres(durable=durable)
                url = create_database(server, "bench")
                note = "local server, fsync on" if durable else "local server, fsync off"
            make_pool(url).sync_inventory()
            base = floor(url, args.ops // 2)
            one = run(worker, url, 1, args.ops)
            one.update(backend=backend, procs=1, note=note,
                       baseline=f"2 empty txns: {base * 1000:.2f} ms/op", ratio=(1 / one["ops_s"]) / base)
            eight = run(worker, url, 8, max(args.ops // 4, 100))
            # The same CPU time per op, 8 processes, no database: the tail the
            # scheduler alone adds on this machine right now.
            cpu = run(cpu_worker, 1 / one["ops_s"], 8, max(args.ops // 4, 100))
            eight.update(backend=backend, procs=8, note=note,
                         baseline=f"cpu-only p99: {cpu['p99']:.2f} ms", ratio=eight["p99"] / cpu["p99"])
            rows += [one, eight]
            if server is not None:
                server.stop()
                server = None
    finally:
        if server is not None:
            server.stop()

    header = (f"{'backend':<15} {'procs':>5} {'ops':>6} {'ops/s':>7} {'p50 ms':>7} {'p99 ms':>7}  "
              f"{'baseline (same run)':<27} {'ratio':>5}  note")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['backend']:<15} {r['procs']:>5} {r['ops']:>6} {r['ops_s']:>7.0f} {r['p50']:>7.2f} {r['p99']:>7.2f}  "
              f"{r['baseline']:<27} {r['ratio']:>5.1f}  {r['note']}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\ncpus: {os.cpu_count()}, load average {load:.1f}; {GPUS} simulated GPUs; "
          "op = try_acquire(1 GPU) + release; latency = one try_acquire.")
    print("ratio: 1 process = time per op / 2 empty write transactions; "
          "8 processes = p99 / p99 of CPU-only work of the same length.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
