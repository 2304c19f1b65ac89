#!/usr/bin/env python3
"""The spawn path with a long queue: a lease on a free GPU while 500 requests wait (SQLite).

    .venv/bin/python bench/bench_queue.py [--waiters 500] [--spawns 200]

One ledger with two hosts: `busy` (4 GPUs, all lent, where the waiters queue) and `free`
(4 GPUs).  In one process and one event loop, as in a hub: acquire(1 GPU on `free`) and its
release, one after another, first with an empty queue, then with N requests waiting on `busy`
(their waits run on the same loop: the queue's reads, heartbeats and wake-ups all count),
in alternating rounds.  Prints the median and p90 latency of acquire() in each phase and the
ratio of the queued median to the empty one (goal, issue 22: <= 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import median, percentile  # noqa: E402
from spawner.inventory import SimulatedInventory  # noqa: E402
from spawner.pool import GPUPool  # noqa: E402
from spawner.pool.ledger.off_loop import ledger_call  # noqa: E402


async def spawns(pool: GPUPool, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        lease = await pool.acquire("spawner", f"s{i}", 1, host="free", timeout=60)
        out.append(time.perf_counter() - t0)
        await ledger_call(pool.release, lease.id, "stopped", timeout=30)
    return out


async def main(waiters: int, n: int, url: str, rounds: int) -> dict[str, list[float]]:
    for host in ("busy", "free"):  # the two hosts' GPUs into the ledger
        (p := GPUPool(inventory=SimulatedInventory(count=4, host=host), db_url=url)).sync_inventory()
        p.close()
    pool = GPUPool(db_url=url, lock_timeout=30)
    for i in range(4):
        pool.try_acquire(f"holder{i}", "", 1, host="busy")
    await spawns(pool, 20)  # warm up
    phases: dict[str, list[float]] = {"empty queue": [], f"{waiters} queued": []}
    for r in range(rounds):  # alternating, so that the machine's other load falls on both alike
        phases["empty queue"] += await spawns(pool, n // rounds)
        tasks = [asyncio.ensure_future(pool.acquire(f"w{r}-{i}", "", 1, host="busy", timeout=3600))
                 for i in range(waiters)]
        while len(pool.queue()) < waiters:
            await asyncio.sleep(0.2)
        await spawns(pool, 5)  # settle
        phases[f"{waiters} queued"] += await spawns(pool, n // rounds)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    pool.close()
    return phases


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--spawns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        phases = asyncio.run(main(args.waiters, args.spawns, f"sqlite:///{d}/ledger.sqlite", args.rounds))
    base = median(phases["empty queue"])
    print(f"\nSpawn path: acquire(1 GPU on a free host), {args.spawns} per queue state in {args.rounds} "
          "alternating rounds, SQLite, one event loop\n")
    print(f"| {'queue':<20} | {'median ms':>9} | {'p90 ms':>7} | {'vs empty':>8} |")
    print(f"|{'-' * 22}|{'-' * 11}|{'-' * 9}|{'-' * 10}|")
    for name, lat in phases.items():
        print(f"| {name:<20} | {median(lat) * 1000:9.2f} | {percentile(lat, 0.9) * 1000:7.2f} | "
              f"{median(lat) / base:7.2f}x |")
    print("\nGoal (issue 22): the queued median within 1.5x of the empty queue's.")
