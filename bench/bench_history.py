"""Benchmark what reads the history: the pool page, api/usage and the grant, with a year of it; and the
fair-share grant against FIFO.  SQLite and PostgreSQL.

    .venv/bin/python bench/bench_history.py [--leases 100000] [--rounds 20] [--db sqlite,postgresql]

Part 1, history: two ledgers side by side in one process, one with an empty history, one with
`--leases` ended leases spread over the last 365 days (a busy lab: 50 users in 5 groups, 1-2 of
8 GPUs each, 5 min to 8 h); the pool service's tornado app on each (bench_poolpage.serve), asked
over HTTP for the page (an admin's, the largest) and api/usage (this week), and the grant itself
(try_acquire of 1 GPU and its release, timed apart), in alternating rounds.  The history is
written in bulk and rolled up by the ledger's upgrade path (rollup.backfill, ensure_decay), as an
upgraded ledger gets it.

Part 2, the queue's order: one ledger with 1,000 users' history (10 leases each over the last 30
days) and 200 live waiters (of 200 of those users) for a host whose GPUs are all lent; the grant
of 1 GPU on another host (which walks the whole queue in its order), with
queue_order = fifo and = fairshare alternating on the same ledger.

Prints medians (and p90) in ms and the ratios (goals, issue 25: history within 2x of empty;
fair-share within 2x of FIFO).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import requests  # noqa: E402
from sqlalchemy import insert, text  # noqa: E402

from bench.bench_poolpage import serve  # noqa: E402
from bench.common import median, percentile  # noqa: E402
from spawner.inventory import SimulatedInventory  # noqa: E402
from spawner.pool import GPUPool, lease_gpus_table, leases_table, waiters_table
from spawner.pool.history import rollup  # noqa: E402
from spawner.poolpage import ADMIN_SCOPE  # noqa: E402
from spawner.poolpage.handlers import base as handlers  # noqa: E402


def bulk_history(pool: GPUPool, leases: int, users: int, days: float, seed: int = 7) -> None:
    """`leases` ended leases over the last `days`, written in bulk, then rolled up as an upgrade does."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    gpus = [s.gpu for s in pool.gpus()]
    engine = pool._engine_ready()
    with engine.begin() as conn:
        next_id = 1
        for chunk in range(0, leases, 5000):
            rows, gpu_rows = [], []
            for i in range(chunk, min(leases, chunk + 5000)):
                start = now - timedelta(seconds=rng.uniform(600, days * 86400))
                end = min(now - timedelta(seconds=1), start + timedelta(seconds=rng.uniform(300, 8 * 3600)))
                rows.append(dict(id=next_id, user_name=f"user{i % users}", server_name="", host=gpus[0].host,
                                 groups=json.dumps([f"group{i % 5}"]), started_at=start, ended_at=end,
                                 end_reason="stopped"))
                for pos, gpu in enumerate(rng.sample(gpus, rng.choice([1, 1, 2]))):
                    gpu_rows.append(dict(lease_id=next_id, uuid=gpu.uuid, host=gpu.host, position=pos, ended_at=end))
                next_id += 1
            conn.execute(insert(leases_table), rows)
            conn.execute(insert(lease_gpus_table), gpu_rows)
        if conn.dialect.name == "postgresql":  # the ids were given: move the sequence past them
            conn.execute(text("SELECT setval(pg_get_serial_sequence('gpu_pool_leases', 'id'), "
                              "(SELECT COALESCE(MAX(id), 0) + 1 FROM gpu_pool_leases), false)"))
        rollup.backfill(conn)
    pool._write(lambda conn: rollup.ensure_decay(pool._store, conn, pool.fairshare_half_life, force=True))


def grant_once(pool: GPUPool, host: str | None = None) -> tuple[float, float]:
    t0 = time.perf_counter()
    lease = pool.try_acquire("bench", "", 1, host=host)
    t1 = time.perf_counter()
    assert lease is not None
    pool.release(lease.id)
    return t1 - t0, time.perf_counter() - t1


def timed_get(session, url: str) -> float:
    t0 = time.perf_counter()
    r = session.get(url, timeout=60)
    assert r.status_code == 200, (url, r.status_code, r.text[:300])
    return time.perf_counter() - t0


def part_history(make_url, leases: int, rounds: int) -> dict:
    ledgers = {}
    for label, n in (("empty", 0), ("history", leases)):
        # (Writing and rolling up a year in one transaction takes longer than a grant's call limits.)
        pool = GPUPool(db_url=make_url(label), inventory=SimulatedInventory(count=8, host="node"),
                       call_timeout=900, statement_timeout=600, lock_timeout=60)
        pool.sync_inventory()
        t0 = time.perf_counter()
        bulk_history(pool, n, users=50, days=365)
        setup = time.perf_counter() - t0
        url, _ = serve(pool)
        ledgers[label] = (pool, url, setup)
    out = {label: {"page": [], "api/usage": [], "grant": [], "end of lease": []} for label in ledgers}
    session = requests.Session()
    for r in range(rounds + 3):
        for label, (pool, url, _) in ledgers.items():
            times = {"page": timed_get(session, url), "api/usage": timed_get(session, url + "api/usage?since=" +
                     (datetime.now(UTC) - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M:%SZ"))}
            times["grant"], times["end of lease"] = grant_once(pool)
            if r >= 3:  # warm-up
                for k, v in times.items():
                    out[label][k].append(v * 1000)
    for pool, _, _ in ledgers.values():
        pool.close()
    out["setup_s"] = {label: setup for label, (_, _, setup) in ledgers.items()}
    return out


def part_order(url: str, rounds: int, users: int = 1000, waiters: int = 200) -> dict:
    for host in ("busy", "free"):
        (p := GPUPool(inventory=SimulatedInventory(count=4, host=host), db_url=url)).sync_inventory()
        p.close()
    pool = GPUPool(db_url=url, waiter_stale_after=3600, lock_timeout=30, call_timeout=900, statement_timeout=600,
                   inventory=SimulatedInventory(count=4, host="free"))
    bulk_history(pool, users * 10, users=users, days=30)
    for i in range(4):
        pool.try_acquire(f"holder{i}", "", 1, host="busy")
    now = datetime.now(UTC)
    rng = random.Random(3)
    pool._write(lambda conn: conn.execute(insert(waiters_table), [
        dict(owner="bench", user_name=f"user{u}", server_name="", count=rng.choice([1, 1, 2]),
             groups=json.dumps([f"group{u % 5}"]), hosts=json.dumps(["busy"]),
             enqueued_at=now + timedelta(milliseconds=i), heartbeat_at=now + timedelta(hours=1))
        for i, u in enumerate(rng.sample(range(users), waiters))]))
    out = {"fifo": [], "fairshare": []}
    for r in range(rounds + 3):
        for order in ("fifo", "fairshare"):
            pool.queue_order = order
            grant, _ = grant_once(pool, host="free")
            if r >= 3:
                out[order].append(grant * 1000)
    assert len(pool.queue()) == waiters
    # The decision for a request that must wait behind all of them (its place and why): every
    # waiter wants any host, all 8 GPUs are lent.
    pool._write(lambda conn: conn.execute(waiters_table.update().values(hosts=None)))
    held = [pool.try_acquire(f"holder-free{i}", "", 1, host="free") for i in range(4)]
    req = pool._make_request("user7", "", 1, ["group2"], None)
    out.update({"fifo, queued": [], "fairshare, queued": []})
    for r in range(rounds + 3):
        for order in ("fifo", "fairshare"):
            pool.queue_order = order
            t0 = time.perf_counter()
            outcome = pool._write(pool._attempt, req, None, False)
            if r >= 3:
                out[f"{order}, queued"].append((time.perf_counter() - t0) * 1000)
            assert outcome.lease is None and outcome.why
    for lease in held:
        pool.release(lease.id)
    pool.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--db", default="sqlite,postgresql")
    args = parser.parse_args()
    handlers.BaseHandler.get_current_user = lambda self: {"name": "ada", "scopes": [ADMIN_SCOPE], "kind": "user"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for db in args.db.split(","):
            server = None
            if db == "sqlite":
                make_url = lambda label: f"sqlite:///{tmp}/{label}.sqlite"  # noqa: E731
            else:
                from devservices.postgres import create_database, start_postgres

                server = start_postgres()
                make_url = lambda label, server=server: create_database(server, f"bench_{label}")  # noqa: E731
            results[db] = (part_history(make_url, args.leases, args.rounds),
                           part_order(make_url("order"), args.rounds * 3))
            if server is not None:
                server.stop()
            report({db: results[db]}, args)  # as each database is done (a later one may fail)
            sys.stdout.flush()


def report(results: dict, args) -> None:
    print(f"\nWhat reads the history: empty vs {args.leases:,} leases over 365 days; ms, {args.rounds} rounds "
          "each (after 3 warm-up), alternating\n")
    print("| database | request | empty: median | empty: p90 | history: median | history: p90 | ratio |")
    print("|---|---|---|---|---|---|---|")
    for db, (hist, _) in results.items():
        for name in ("page", "api/usage", "grant", "end of lease"):
            e, h = hist["empty"][name], hist["history"][name]
            print(f"| {db} | {name} | {median(e):.2f} | {percentile(e, 0.9):.2f} | {median(h):.2f} | "
                  f"{percentile(h, 0.9):.2f} | {median(h) / median(e):.2f} |")
    print("\nThe grant with 1,000 users' history and 200 waiters: fifo vs fairshare, same ledger, alternating; ms\n")
    print("| database | decision | fifo: median | fifo: p90 | fairshare: median | fairshare: p90 | ratio |")
    print("|---|---|---|---|---|---|---|")
    for db, (_, order) in results.items():
        for what, suffix in (("a lease on a free host (200 wait on a full one)", ""),
                             ("a place behind 200 waiters (and why)", ", queued")):
            f, s = order["fifo" + suffix], order["fairshare" + suffix]
            print(f"| {db} | {what} | {median(f):.2f} | {percentile(f, 0.9):.2f} | {median(s):.2f} | "
                  f"{percentile(s, 0.9):.2f} | {median(s) / median(f):.2f} |")
    for db, (hist, _) in results.items():
        print(f"\n{db}: writing and rolling up {args.leases:,} leases took {hist['setup_s']['history']:.1f} s "
              "(the one-time upgrade)")
    print("\nGoals (issue 25): history within 2x of empty; fairshare within 2x of fifo.")


if __name__ == "__main__":
    main()
