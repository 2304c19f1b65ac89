"""Benchmark the GPU pool page: how long the page and its usage APIs take with 1,000 leases of history.

    .venv/bin/python bench/bench_poolpage.py [--leases 1000] [--rounds 30]

The service's tornado app (spawner.poolpage.app.make_app) on 127.0.0.1 with an
SQLite ledger of 8 simulated GPUs, asked over HTTP by `requests`.  Two ledgers
side by side in the same process: the baseline with an empty history, and
one with `--leases` ended leases spread over the last 7 days (20 users, 4
groups, 1-2 GPUs each), 50 drain/undrain records and 200 queue records.  The
viewer is a pool admin (the largest page: every user's GPU-hours, the audit
list, the action buttons); the hub's login and its server list are stand-ins
(the hub's own cost is not the page's).  Prints the median and p90 of each
request and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import requests  # noqa: E402
from sqlalchemy import insert, update  # noqa: E402

from bench.common import median, percentile  # noqa: E402
from devservices.ports import free_port  # noqa: E402
from spawner.inventory import SimulatedInventory  # noqa: E402
from spawner.pool import GPUPool  # noqa: E402
from spawner.pool.ledger.schema import audit_table, lease_gpus_table, leases_table, queue_log_table  # noqa: E402
from spawner.poolpage import ADMIN_SCOPE, app  # noqa: E402
from spawner.poolpage.handlers import base as handlers  # noqa: E402

REQUESTS = [("page", ""), ("page, 30 days", "?period=30d"), ("api/usage", "api/usage"),
            ("api/occupancy", "api/occupancy"), ("api/occupancy.csv, 30 days", "api/occupancy.csv?period=30d")]


class NoHub:
    """The hub's list of running servers, as the page asks for it: none."""

    async def active_servers(self):
        return []


def fill(pool: GPUPool, leases: int) -> None:
    """`leases` ended leases over the last 7 days, plus drains and queue records, written directly."""
    rng = random.Random(7)
    now = datetime.now(UTC)
    gpus = [s.gpu for s in pool.gpus()]
    engine = pool._engine_ready()
    with engine.begin() as conn:
        for i in range(leases):
            start = now - timedelta(seconds=rng.uniform(600, 7 * 86400))
            end = min(now, start + timedelta(seconds=rng.uniform(300, 4 * 3600)))
            user = f"user{i % 20}"
            lid = conn.execute(insert(leases_table).values(
                user_name=user, server_name="", host=gpus[0].host, groups=json.dumps([f"group{i % 4}"]),
                started_at=start, ended_at=end, end_reason=rng.choice(["stopped", "culled", "admin"]))
            ).inserted_primary_key[0]
            for pos, gpu in enumerate(rng.sample(gpus, rng.choice([1, 1, 2]))):
                conn.execute(insert(lease_gpus_table).values(lease_id=lid, uuid=gpu.uuid, host=gpu.host,
                                                             position=pos, ended_at=end))
        for i in range(50):
            conn.execute(insert(audit_table).values(at=now - timedelta(hours=3 * (50 - i)), actor="ada",
                                                    action="drain" if i % 2 == 0 else "undrain",
                                                    host=gpus[0].host, uuid=gpus[i % 8].uuid))
        for i in range(200):
            t = now - timedelta(seconds=rng.uniform(600, 7 * 86400))
            conn.execute(insert(queue_log_table).values(id=100000 + i, user_name=f"user{i % 20}", count=1,
                                                        enqueued_at=t,
                                                        left_at=t + timedelta(seconds=rng.uniform(5, 900)),
                                                        outcome="served"))
        conn.execute(update(leases_table).values(server_name=""))


def serve(pool: GPUPool) -> tuple[str, threading.Thread]:
    port = free_port()
    ready = threading.Event()

    def run():
        async def main():
            web_app = app.make_app(pool, "/services/gpu-pool/", "/", False)
            web_app.settings["hub_api"] = NoHub()
            web_app.listen(port, "127.0.0.1")
            ready.set()
            await asyncio.Event().wait()
        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    return f"http://127.0.0.1:{port}/services/gpu-pool/", thread


def measure(url: str, rounds: int) -> dict[str, list[float]]:
    out = {}
    session = requests.Session()
    for name, path in REQUESTS:
        times = []
        for i in range(rounds + 3):
            t0 = time.perf_counter()
            r = session.get(url + path, timeout=60)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 200, (name, r.status_code, r.text[:300])
            if i >= 3:  # warm-up
                times.append(elapsed * 1000)
        out[name] = times
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    # The hub's login, stood in for: a pool admin.
    handlers.BaseHandler.get_current_user = lambda self: {"name": "ada", "scopes": [ADMIN_SCOPE], "kind": "user"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, leases in (("empty", 0), ("history", args.leases)):
            pool = GPUPool(db_url=f"sqlite:///{tmp}/{label}.sqlite", inventory=SimulatedInventory(count=8))
            pool.sync_inventory()
            fill(pool, leases)
            url, _ = serve(pool)
            results[label] = measure(url, args.rounds)
    print(f"GPU pool page, {args.rounds} requests each (after 3 warm-up), ms; baseline: an empty history")
    print(f"| request | empty: median | empty: p90 | {args.leases:,} leases: median | "
          f"{args.leases:,} leases: p90 | ratio of medians |")
    print("|---|---|---|---|---|---|")
    for name, _ in REQUESTS:
        e, h = results["empty"][name], results["history"][name]
        print(f"| {name} | {median(e):.1f} | {percentile(e, 0.9):.1f} | {median(h):.1f} | "
              f"{percentile(h, 0.9):.1f} | {median(h) / median(e):.2f} |")


if __name__ == "__main__":
    main()
