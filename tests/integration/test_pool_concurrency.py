"""Many real processes on one ledger, SQLite and PostgreSQL: no GPU is ever lent twice.

Each worker is a separate Python process (multiprocessing, spawn) with its
own GPUPool, as separate hub processes would be.  Double lending is looked
for two ways: from the ledger's own history (no two leases of one GPU with
overlapping [start, end)), and live, by a witness file per GPU that a worker
creates with O_EXCL while it holds the GPU.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from devservices.waiting import until
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool, PoolUnavailable, lease_gpus_table, leases_table

HOST = "hammer-host"
GPUS = 4
WORKERS = 8


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    return request.getfixturevalue("postgres_database")


def make_pool(url: str, **kwargs) -> GPUPool:
    kwargs.setdefault("poll_interval", 0.02)
    kwargs.setdefault("lock_timeout", 30)
    return GPUPool(inventory=SimulatedInventory(count=GPUS, host=HOST), db_url=url, **kwargs)


# --- worker processes (top level: spawn imports them by name) ----------------


def hammer(url: str, worker: int, iterations: int, witness_dir: str, options: dict) -> dict:
    """Acquire 1-2 GPUs, hold them briefly, release; `iterations` times."""
    pool = make_pool(url, **options)
    rng = random.Random(worker)
    errors: list[str] = []

    async def run() -> int:
        done = 0
        for i in range(iterations):
            lease = await pool.acquire(f"user{worker}", f"s{i}", rng.choice((1, 1, 2)), groups=["g"], timeout=120)
            held = []
            for uuid in lease.gpu_uuids:
                try:
                    os.close(os.open(os.path.join(witness_dir, uuid), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    held.append(uuid)
                except FileExistsError:
                    errors.append(f"lease {lease.id}: {uuid} already held by another worker")
            await asyncio.sleep(rng.random() * 0.003)  # not a wait: the lease is held a random while
            for uuid in held:
                os.unlink(os.path.join(witness_dir, uuid))
            pool.release(lease.id, rng.choice(("stopped", "culled")))
            done += 1
        return done

    done = asyncio.run(run())
    pool.close()
    return {"worker": worker, "done": done, "errors": errors}


def hold_transaction_open(url: str, ready) -> None:
    """Begin a lease of every GPU inside a write transaction, then wait to be killed."""
    pool = make_pool(url)
    pool.counts()

    def write_and_hang(conn):
        now = datetime.now(UTC)
        lease_id = conn.execute(
            insert(leases_table).values(user_name="doomed", server_name="", host=HOST, groups="[]", started_at=now)
        ).inserted_primary_key[0]
        for i in range(GPUS):
            conn.execute(insert(lease_gpus_table).values(
                lease_id=lease_id, uuid=SimulatedInventory.uuid_for(HOST, i), host=HOST, position=i))
        ready.set()
        time.sleep(600)  # SIGKILL arrives here, the transaction still open

    pool._write(write_and_hang)


# --- checks --------------------------------------------------------------------


def assert_no_double_lending(pool: GPUPool) -> int:
    """From the ledger's history: per GPU, lease intervals never overlap. Returns leases checked."""
    now = datetime.now(UTC)
    per_gpu = defaultdict(list)
    leases = pool.history()
    for lease in leases:
        for uuid in lease.gpu_uuids:
            per_gpu[(lease.host, uuid)].append((lease.started_at, lease.ended_at or now, lease.id))
    for gpu, spans in per_gpu.items():
        spans.sort()
        for (s1, e1, id1), (s2, e2, id2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"GPU {gpu} lent twice: lease {id1} [{s1}, {e1}) overlaps lease {id2} [{s2}, {e2})"
    return len(leases)


def spawn_pool(n):
    return multiprocessing.get_context("spawn").Pool(n)


# --- tests ----------------------------------------------------------------------


def test_eight_processes_never_double_lend(ledger_url, tmp_path):
    witness = tmp_path / "witness"
    witness.mkdir()
    iterations = 40
    make_pool(ledger_url).sync_inventory()  # one schema creation, not eight racing
    with spawn_pool(WORKERS) as procs:
        results = procs.starmap(
            hammer, [(ledger_url, w, iterations, str(witness), {}) for w in range(WORKERS)], chunksize=1
        )
    assert [r["errors"] for r in results] == [[]] * WORKERS
    assert sum(r["done"] for r in results) == WORKERS * iterations
    pool = make_pool(ledger_url)
    assert assert_no_double_lending(pool) == WORKERS * iterations
    assert pool.leases() == [] and pool.queue() == []
    assert pool.counts()["free"] == GPUS
    usage = pool.usage()
    assert set(usage["users"]) == {f"user{w}" for w in range(WORKERS)}
    assert usage["groups"]["g"] == pytest.approx(sum(usage["users"].values()))


def test_schema_creation_races_are_harmless(ledger_url, tmp_path):
    # Eight processes open a brand-new ledger at the same moment.
    witness = tmp_path / "witness"
    witness.mkdir()
    with spawn_pool(WORKERS) as procs:
        results = procs.starmap(hammer, [(ledger_url, w, 3, str(witness), {}) for w in range(WORKERS)])
    assert sum(r["done"] for r in results) == WORKERS * 3
    assert assert_no_double_lending(make_pool(ledger_url)) == WORKERS * 3


def test_database_rejects_a_direct_double_insert(ledger_url):
    pool = make_pool(ledger_url)
    pool.sync_inventory()
    engine = pool._engine_ready()
    gpu = SimulatedInventory.uuid_for(HOST, 0)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        ids = [
            conn.execute(insert(leases_table).values(
                user_name=u, server_name="", host=HOST, groups="[]", started_at=now)).inserted_primary_key[0]
            for u in ("first", "second")
        ]
        conn.execute(insert(lease_gpus_table).values(lease_id=ids[0], uuid=gpu, host=HOST, position=0))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(lease_gpus_table).values(lease_id=ids[1], uuid=gpu, host=HOST, position=0))
    # The pool itself still sees exactly one holder and lends the other GPUs.
    holders = [s for s in pool.gpus() if s.lease is not None]
    assert [(s.gpu.uuid, s.lease.user) for s in holders] == [(gpu, "first")]
    lease = pool.try_acquire("alice", "", GPUS - 1)
    assert lease is not None and gpu not in lease.gpu_uuids


def test_sigkill_in_the_middle_of_a_transaction(ledger_url):
    pool = make_pool(ledger_url, lock_timeout=10)
    pool.sync_inventory()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=hold_transaction_open, args=(ledger_url, ready))
    proc.start()
    try:
        assert ready.wait(60), "the worker never got inside its transaction"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    # Nothing of the killed transaction remains, the lock is free again,
    # and every GPU can be lent.
    lease = pool.try_acquire("alice", "", GPUS)
    assert lease is not None and len(lease.gpu_uuids) == GPUS
    assert [l.user for l in pool.history()] == ["alice"]
    assert pool.release(lease.id, "stopped")


def test_processes_killed_while_hammering_leave_a_usable_ledger(ledger_url, tmp_path):
    witness = tmp_path / "witness"
    witness.mkdir()
    options = {"waiter_stale_after": 1.0, "backfill_window": 0.5}
    make_pool(ledger_url).sync_inventory()
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=hammer, args=(ledger_url, w, 10_000, str(witness), options)) for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    pool = make_pool(ledger_url, **options)
    try:
        # Let them get going, then kill them one by one at random moments.
        until(lambda: len(pool.history()) >= 50, timeout=60, interval=0.05, what="the workers' first 50 leases")
        rng = random.Random(7)
        for p in procs:
            time.sleep(rng.random() * 0.1)  # not a wait: each is killed at a random moment
            os.kill(p.pid, signal.SIGKILL)
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join(30)
    assert_no_double_lending(pool)
    # Leases of the dead workers stay until reconciled (no container holds them).
    pool.reconcile(HOST, set())
    assert pool.leases() == []
    # Their queue rows go stale and stop counting; the whole pool is lendable.
    # (With fair-share order the admin, with no recent use, may be served before they go stale.)
    lease = asyncio.run(pool.acquire("admin", "", GPUS, timeout=30))
    assert len(lease.gpu_uuids) == GPUS
    until(lambda: not pool.queue(), timeout=10 * options["waiter_stale_after"],
          what="the dead processes' queue rows to stop counting", explain=lambda: f"queue: {pool.queue()}")
    assert_no_double_lending(pool)


def test_postgres_lock_held_too_long_is_a_clear_error(postgres_database):
    import psycopg
    from sqlalchemy.engine import make_url

    from spawner.pool import PG_LOCK_KEY

    pool = make_pool(postgres_database, lock_timeout=0.3)
    pool.sync_inventory()
    url = make_url(postgres_database)
    with psycopg.connect(host=url.host, port=url.port, user=url.username, password=url.password,
                         dbname=url.database) as blocker:
        blocker.execute("SELECT pg_advisory_xact_lock(%s)", (PG_LOCK_KEY,))
        with pytest.raises(PoolUnavailable, match="locked for more than 0.3 s") as info:
            pool.try_acquire("alice", "", 1)
        assert url.password not in str(info.value)
    assert pool.history() == []
    assert pool.try_acquire("alice", "", 1) is not None


def test_postgres_restart_is_survived_without_an_error(postgres_server, postgres_database):
    pool = make_pool(postgres_database)
    first = pool.try_acquire("alice", "", 1)
    postgres_server.restart()
    # The pooled connection died with the server; the next call reconnects.
    assert pool.release(first.id, "stopped") is True
    assert pool.try_acquire("bob", "", 1) is not None
