"""Gang leasing: a cluster's workers get all their GPUs in one transaction, or none (SQLite)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from devservices.waiting import async_until as until
from spawner.inventory import SimulatedInventory, StaticInventory
from spawner.pool import (
    SCHEMA_VERSION,
    GPUPool,
    InvalidRequest,
    QuotaExceeded,
    Unsatisfiable,
    WaitTimeout,
    waiters_table,
)
from spawner.pool.leasing.placement import choose, choose_gang
from spawner.pool.leasing.policy import Snapshot, WaiterRow, available_after

HOST = "node-1"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def far(host, a, b):
    return 50


def pick(f, h, c):
    return choose(f, h, c, far)


def free_of(**hosts: int) -> dict:
    return {h: [(i, f"{h}-gpu{i}") for i in range(n)] for h, n in hosts.items()}


def make_pool(tmp_path, count=4, **kwargs) -> GPUPool:
    kwargs.setdefault("poll_interval", 0.05)
    return GPUPool(inventory=SimulatedInventory(count=count, host=HOST),
                   db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", **kwargs)


def queue_rows(pool):
    with pool._engine_ready().connect() as conn:
        return conn.execute(select(waiters_table)).all()


# --- placement: pure -----------------------------------------------------------------


def test_a_gang_takes_one_host_when_one_fits_it_all():
    picks = choose_gang(pick, free_of(a=4, b=2), None, 1, 2)
    assert [h for h, _ in picks] == ["b", "b"]  # best fit: the smaller host that holds both
    assert [len(u) for _, u in picks] == [1, 1] and picks[0][1] != picks[1][1]


def test_a_gang_spans_the_fewest_hosts_when_no_host_fits_it():
    picks = choose_gang(pick, free_of(a=1, b=3, c=2), None, 1, 4)
    hosts = [h for h, _ in picks]
    assert sorted(set(hosts)) == ["a", "b"]  # 3 + 1: two hosts, not three
    uuids = [u for _, us in picks for u in us]
    assert len(set(uuids)) == 4


def test_a_gang_keeps_to_its_hosts_and_never_splits_a_worker():
    # The host tags narrow it to "a": 3 free GPUs there cannot hold 2 workers x 2.
    assert choose_gang(pick, free_of(a=3, b=4), ["a"], 2, 2) is None
    # Across a and b each worker's 2 GPUs stay on one host.
    picks = choose_gang(pick, free_of(a=3, b=3), None, 2, 2)
    assert sorted(h for h, _ in picks) == ["a", "b"]
    assert choose_gang(pick, free_of(a=3, b=3), None, 2, 3) is None


def test_a_young_gang_lets_small_requests_pass_an_old_one_holds_free_gpus():
    s = Snapshot.from_rows([("a", f"g{i}", i, True, False, 7 if i == 0 else None) for i in range(4)])

    def gang(age_s):
        return WaiterRow(1, "u1", 2, None, NOW - timedelta(seconds=age_s), NOW, workers=2)

    assert len(available_after(s, [gang(5)], NOW, 15, pick)["a"]) == 3  # within the window: backfill
    assert available_after(s, [gang(20)], NOW, 15, pick)["a"] == []  # past it: held for the gang


# --- the ledger ----------------------------------------------------------------------


def test_a_gang_is_granted_in_one_transaction_one_lease_per_worker(tmp_path):
    pool = make_pool(tmp_path)
    leases = asyncio.run(pool.acquire_gang("alice", "job/7", 2, 2, groups=["ml"], timeout=5))
    assert [l.server_name for l in leases] == ["job/7/worker-0", "job/7/worker-1"]
    assert all(len(l.gpu_uuids) == 2 and l.host == HOST for l in leases)
    assert len({u for l in leases for u in l.gpu_uuids}) == 4
    assert pool.counts()["free"] == 0
    assert pool.release_all([l.id for l in leases], "job-failed") == [l.id for l in leases]
    assert {h.end_reason for h in pool.history("alice")} == {"job-failed"}
    assert pool.counts()["free"] == 4
    pool.close()


def test_a_gang_that_does_not_fit_waits_holding_nothing_then_starts_whole(tmp_path):
    pool = make_pool(tmp_path)
    held = pool.try_acquire("bob", "", 1)  # 3 of 4 free
    positions = []

    async def main():
        task = asyncio.ensure_future(pool.acquire_gang(
            "alice", "job/9", 2, 2, timeout=30, on_wait=lambda *a: positions.append(a)))
        await until(lambda: positions)
        # It waits as one queue entry and holds not one GPU.
        assert [l.user for l in pool.leases()] == ["bob"]
        assert [(w.user, w.count, w.workers) for w in pool.queue()] == [("alice", 2, 2)]
        assert pool.queue()[0].to_dict()["workers"] == 2
        pool.release(held.id)
        return await task

    leases = asyncio.run(main())
    assert positions == [(1, 4, 3)]  # 1st, wants 4 in all, 3 free
    assert len(leases) == 2 and pool.counts() == {"free": 0, "lent": 4, "drained": 0, "queued": 0}
    assert queue_rows(pool) == []
    pool.close()


def test_a_gang_that_times_out_or_is_cancelled_leaves_nothing(tmp_path):
    pool = make_pool(tmp_path)
    pool.try_acquire("bob", "", 3)
    with pytest.raises(WaitTimeout, match="queue for 2 workers x 1 GPU"):
        asyncio.run(pool.acquire_gang("alice", "job/1", 1, 2, timeout=0.2))

    async def cancel():
        task = asyncio.ensure_future(pool.acquire_gang("alice", "job/2", 1, 2, timeout=30))
        await until(lambda: pool.queue())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert [l.user for l in pool.leases()] == ["bob"] and queue_rows(pool) == []
    pool.close()


def test_two_gangs_never_deadlock_and_small_requests_are_served(tmp_path):
    """Two 2x2 clusters and 1-GPU requests against 4 GPUs: every one is served in turn,
    and at no moment does any cluster hold part of its GPUs."""
    pool = make_pool(tmp_path, backfill_window=0.0)
    seen_partial = []

    async def gang(name):
        leases = await pool.acquire_gang("alice", name, 2, 2, timeout=30)
        await asyncio.sleep(0.05)  # the cluster holds its GPUs a while, so the others queue behind it
        pool.release_all([l.id for l in leases], "job-finished")
        return name

    async def single(name):
        lease = await pool.acquire("bob", name, 1, timeout=30)
        await asyncio.sleep(0.02)  # held a while, as a server would
        pool.release(lease.id)
        return name

    async def watch(done):
        while not done.is_set():
            by_gang = {}
            for l in pool.leases():
                if "/worker-" in l.server_name:
                    by_gang.setdefault(l.server_name.rsplit("/", 1)[0], 0)
                    by_gang[l.server_name.rsplit("/", 1)[0]] += 1
            seen_partial.extend(n for n in by_gang.values() if n != 2)
            await asyncio.sleep(0.005)  # not a wait: the watcher samples the leases until the end

    async def main():
        done = asyncio.Event()
        watcher = asyncio.ensure_future(watch(done))
        served = await asyncio.gather(gang("job/a"), single("s1"), gang("job/b"), single("s2"), single("s3"))
        done.set()
        await watcher
        return served

    assert sorted(asyncio.run(main())) == ["job/a", "job/b", "s1", "s2", "s3"]
    assert seen_partial == [] and pool.leases() == [] and queue_rows(pool) == []
    pool.close()


def test_quota_counts_every_workers_gpus(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=3)
    with pytest.raises(QuotaExceeded, match="at most 3 GPUs .* asked for 4"):
        pool.check_request("alice", 2, workers=2)
    pool.check_request("alice", 1, workers=3)
    pool.close()


@pytest.mark.parametrize("workers", [0, -1, 10**9, "2", [2], 2.0, True, None])
def test_bad_worker_counts_are_refused(tmp_path, workers):
    pool = make_pool(tmp_path)
    with pytest.raises(InvalidRequest, match="number of workers"):
        pool.check_request("alice", 1, workers=workers)
    with pytest.raises(InvalidRequest):
        asyncio.run(pool.acquire_gang("alice", "job/3", 1, workers, timeout=1))
    assert pool.leases() == [] and queue_rows(pool) == []
    pool.close()


def test_a_gang_bigger_than_its_hosts_is_refused_at_once(tmp_path):
    pool = make_pool(tmp_path)
    with pytest.raises(Unsatisfiable, match=r"3 workers x 2 GPUs \(6 GPUs at once\).*at most 2 such workers"):
        pool.check_request("alice", 2, workers=3)
    pool.close()


def test_on_several_hosts_a_gang_spans_only_when_no_host_fits_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    for host in ("a", "b"):
        inv = StaticInventory(host=host, gpus_list=[{"uuid": f"GPU-{host}{i}", "index": i} for i in range(2)])
        GPUPool(inventory=inv, db_url=url).sync_inventory()
    pool = GPUPool(db_url=url, poll_interval=0.05)  # no inventory: every host (as on Swarm)
    try:
        two = asyncio.run(pool.acquire_gang("alice", "job/1", 1, 2, timeout=2))
        assert len({l.host for l in two}) == 1
        pool.release_all([l.id for l in two])
        three = asyncio.run(pool.acquire_gang("alice", "job/2", 1, 3, timeout=2))
        assert sorted(l.host for l in three) in (["a", "a", "b"], ["a", "b", "b"])
        pool.release_all([l.id for l in three])
        # The profile's host tags narrow it: on "b" alone, 3 workers can never fit.
        with pytest.raises(Unsatisfiable, match="host b can hold at most 2"):
            pool.check_request("alice", 1, host=["b"], workers=3)
    finally:
        pool.close()


def test_a_version_7_ledger_gains_the_workers_column_in_place(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    GPUPool(db_url=url, inventory=SimulatedInventory(count=2, host=HOST)).sync_inventory()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as schema 7 left it: no workers column
        conn.execute(sa.text("ALTER TABLE gpu_pool_waiters DROP COLUMN workers"))
        conn.execute(sa.text("UPDATE gpu_pool_meta SET value='7' WHERE key='schema_version'"))
    pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=2, host=HOST), poll_interval=0.05)
    try:
        assert len(asyncio.run(pool.acquire_gang("alice", "job/1", 1, 2, timeout=2))) == 2
    finally:
        pool.close()
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT value FROM gpu_pool_meta WHERE key='schema_version'")).scalar()
        assert version == str(SCHEMA_VERSION)
    engine.dispose()
