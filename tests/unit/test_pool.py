"""The lease ledger on SQLite: lending, input checks, quotas, drain, release, reconcile, accounting."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from spawner.inventory import SimulatedInventory, StaticInventory
from spawner.pool import (
    EndReason,
    GPUPool,
    InvalidRequest,
    PoolUnavailable,
    QuotaExceeded,
    UnknownGPU,
    Unsatisfiable,
    lease_gpus_table,
    leases_table,
)

HOST = "node-1"


def make_pool(tmp_path, count=4, name="ledger.sqlite", **kwargs) -> GPUPool:
    inv = SimulatedInventory(count=count, host=HOST)
    return GPUPool(inventory=inv, db_url=f"sqlite:///{tmp_path / name}", **kwargs)


@pytest.fixture
def pool(tmp_path):
    p = make_pool(tmp_path)
    yield p
    p.close()


def uuids(pool):
    return [s.gpu.uuid for s in pool.gpus()]


def test_lends_distinct_gpus_until_none_is_left(pool):
    a = pool.try_acquire("alice", "", 2, groups=["ml"])
    b = pool.try_acquire("bob", "gpu", 2)
    assert a.host == b.host == HOST
    assert len(a.gpu_uuids) == 2 and len(b.gpu_uuids) == 2
    assert set(a.gpu_uuids).isdisjoint(b.gpu_uuids)
    assert pool.try_acquire("carol", "", 1) is None
    assert a.groups == ("ml",) and a.started_at.tzinfo is not None
    assert {l.id for l in pool.leases()} == {a.id, b.id}
    assert pool.lease(a.id) == a
    assert pool.counts() == {"free": 0, "lent": 4, "drained": 0, "queued": 0}


def test_all_or_nothing(pool):
    pool.try_acquire("alice", "", 3)
    assert pool.try_acquire("bob", "", 2) is None
    # Nothing was half-taken: the one free GPU is still free.
    assert pool.counts()["free"] == 1
    assert len(pool.leases()) == 1


def test_multi_gpu_lease_takes_the_closest_gpus(pool):
    g = uuids(pool)  # simulated topology: pairs (0,1), (2,3) share a PCIe switch
    single = pool.try_acquire("alice", "", 1)
    # A single GPU leaves a close pair intact...
    assert single.gpu_uuids[0] in g
    pair = pool.try_acquire("bob", "", 2)
    # ...so the pair request gets two GPUs behind one switch.
    assert {g.index(u) // 2 for u in pair.gpu_uuids} == {g.index(single.gpu_uuids[0]) // 2 ^ 1}
    pool.release(single.id, "stopped")
    pool.release(pair.id, "stopped")
    # After GPU 1 is taken, GPU 0 is the isolated one a single request should take.
    first = pool.try_acquire("x", "", 1)
    second = pool.try_acquire("y", "", 1)
    pair = pool.try_acquire("z", "", 2)
    assert pair is not None and len({g.index(u) // 2 for u in pair.gpu_uuids}) == 1
    assert {first.gpu_uuids[0], second.gpu_uuids[0]}.isdisjoint(pair.gpu_uuids)


@pytest.mark.parametrize("count", [0, -1, 1.5, "2", None, True])
def test_bad_count_is_refused(pool, count):
    with pytest.raises(InvalidRequest, match="number of GPUs") as info:
        pool.try_acquire("alice", "", count)
    assert info.value.status_code == 400
    assert pool.history() == []


@pytest.mark.parametrize(
    "user, server, groups",
    [("", "", ()), (42, "", ()), ("alice", None, ()), ("alice", "", "ml"), ("a" * 300, "", ()), ("al\nice", "", ())],
)
def test_bad_names_are_refused(pool, user, server, groups):
    with pytest.raises(InvalidRequest):
        pool.try_acquire(user, server, 1, groups=groups)


def test_more_gpus_than_any_host_has(pool):
    with pytest.raises(Unsatisfiable) as info:
        pool.try_acquire("alice", "", 5)
    assert "5 GPUs" in str(info.value) and "4 GPUs" in str(info.value)
    assert info.value.status_code == 400


def test_a_pool_without_gpus_says_so(tmp_path):
    p = make_pool(tmp_path, count=0)
    with pytest.raises(Unsatisfiable, match="no GPUs"):
        p.try_acquire("alice", "", 1)


def test_release_is_idempotent_and_records_the_reason(pool):
    lease = pool.try_acquire("alice", "", 2)
    assert pool.release(lease.id, EndReason.CULLED) is True
    assert pool.release(lease.id, EndReason.STOPPED) is False
    assert pool.release(99999, "stopped") is False
    ended = pool.lease(lease.id)
    assert ended.end_reason == "culled" and ended.ended_at >= ended.started_at
    assert pool.counts()["free"] == 4
    assert pool.leases() == []


def test_release_rejects_unknown_reasons(pool):
    lease = pool.try_acquire("alice", "", 1)
    with pytest.raises(InvalidRequest, match="stopped, culled"):
        pool.release(lease.id, "bored")
    with pytest.raises(InvalidRequest):
        pool.release("1", "stopped")
    assert pool.lease(lease.id).ended_at is None


def test_lease_ids_are_never_reused(pool):
    a = pool.try_acquire("alice", "", 1)
    pool.release(a.id, "stopped")
    b = pool.try_acquire("alice", "", 1)
    assert b.id > a.id


def test_drained_gpu_is_never_lent(pool):
    g = uuids(pool)
    status = pool.drain(g[0])
    assert status.drained and status.state == "drained"
    leases = [pool.try_acquire(f"u{i}", "", 1) for i in range(3)]
    assert all(l is not None for l in leases)
    assert pool.try_acquire("late", "", 1) is None
    assert g[0] not in {u for l in leases for u in l.gpu_uuids}
    assert pool.counts() == {"free": 0, "lent": 3, "drained": 1, "queued": 0}
    # Asking for all 4 while one is drained can never be met now.
    with pytest.raises(Unsatisfiable, match="drained"):
        pool.check_request("x", 4)
    pool.undrain(g[0])
    assert pool.try_acquire("late", "", 1).gpu_uuids == (g[0],)


def test_draining_a_lent_gpu_keeps_its_lease(pool):
    lease = pool.try_acquire("alice", "", 4)
    status = pool.drain(lease.gpu_uuids[0])
    assert status.state == "lent" and status.drained and status.lease.id == lease.id
    pool.release(lease.id, "stopped")
    with pytest.raises(Unsatisfiable, match="1 more drained"):
        pool.try_acquire("bob", "", 4)
    assert pool.try_acquire("bob", "", 3) is not None
    assert pool.counts()["drained"] == 1


def test_drain_unknown_gpu(pool):
    with pytest.raises(UnknownGPU, match="GPU-nope") as info:
        pool.drain("GPU-nope")
    assert info.value.status_code == 404
    with pytest.raises(UnknownGPU):
        pool.undrain(uuids(pool)[0], host="other-host")


def test_user_quota_counts_all_named_servers(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=2)
    pool.try_acquire("alice", "", 1)
    pool.try_acquire("alice", "second", 1)
    with pytest.raises(QuotaExceeded) as info:
        pool.try_acquire("alice", "third", 1)
    message = str(info.value)
    assert "at most 2 GPUs" in message and "you hold 2" in message and "'second'" in message
    assert info.value.status_code == 403
    with pytest.raises(QuotaExceeded, match="at most 2"):
        pool.check_request("bob", 3)
    assert pool.try_acquire("bob", "", 2) is not None


def test_group_limits_take_the_largest_of_the_users_groups(tmp_path):
    pool = make_pool(tmp_path, count=8, max_gpus_per_user=1, group_gpu_limits={"ml": 4, "students": 2})
    assert pool.limit_for(["students", "ml"])[0] == 4
    assert pool.try_acquire("alice", "", 4, groups=["students", "ml"]) is not None
    with pytest.raises(QuotaExceeded, match="group 'students'"):
        pool.try_acquire("bob", "", 3, groups=["students"])
    with pytest.raises(QuotaExceeded, match="per-user limit"):
        pool.try_acquire("carol", "", 2, groups=["other"])


def test_zero_limit_means_no_gpus_and_none_means_unlimited(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=0, group_gpu_limits={"staff": None})
    with pytest.raises(QuotaExceeded):
        pool.try_acquire("guest", "", 1)
    assert pool.try_acquire("boss", "", 4, groups=["staff"]) is not None


def test_reconcile_ends_leases_without_a_container(pool):
    keep = pool.try_acquire("alice", "", 1)
    lost = pool.try_acquire("bob", "", 2)
    ended = pool.reconcile(HOST, {keep.id})
    assert [l.id for l in ended] == [lost.id]
    assert ended[0].end_reason == "reconciled"
    assert pool.lease(lost.id).end_reason == "reconciled"
    assert [l.id for l in pool.leases()] == [keep.id]
    assert pool.reconcile("other-host", set()) == []
    assert pool.reconcile(HOST, {keep.id}) == []


def test_history_and_gpu_hours_per_user_and_group(pool):
    a = pool.try_acquire("alice", "", 2, groups=["ml", "staff"])
    b = pool.try_acquire("bob", "", 1, groups=["ml"])
    pool.release(a.id, "stopped")
    hist = pool.history()
    assert [l.id for l in hist] == [a.id, b.id]
    assert pool.history(user="bob")[0].id == b.id
    usage = pool.usage()
    assert usage["users"]["alice"] > 0 and usage["users"]["bob"] > 0
    assert usage["groups"]["ml"] == pytest.approx(usage["users"]["alice"] + usage["users"]["bob"])
    assert usage["groups"]["staff"] == pytest.approx(usage["users"]["alice"])
    future = datetime.now(UTC) + timedelta(hours=1)
    assert [l.id for l in pool.history(since=future)] == [b.id]  # only the active one overlaps
    assert pool.history(until=datetime(2000, 1, 1)) == []


def test_gpu_hours_are_clipped_to_the_period():
    from spawner.pool import Lease

    start = datetime(2024, 1, 1, 0, 0, tzinfo=UTC)
    lease = Lease(1, "a", "", "h", ("g1", "g2"), (), start, start + timedelta(hours=3), "stopped")
    assert lease.gpu_hours() == pytest.approx(6.0)
    assert lease.gpu_hours(since=start + timedelta(hours=1), until=start + timedelta(hours=2)) == pytest.approx(2.0)
    assert lease.gpu_hours(since=start + timedelta(hours=5)) == 0.0


def test_gpus_gone_from_the_inventory_are_not_lent(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    big = GPUPool(inventory=SimulatedInventory(count=4, host=HOST), db_url=url)
    held = big.try_acquire("alice", "", 1)
    small = GPUPool(inventory=SimulatedInventory(count=2, host=HOST), db_url=url)
    small.sync_inventory()
    states = {s.gpu.index: s.state for s in small.gpus()}
    assert states[2] in ("missing", "lent") and states[3] in ("missing", "lent")
    lent = [small.try_acquire(f"u{i}", "", 1) for i in range(3)]
    got = {u for l in lent if l for u in l.gpu_uuids} | set(held.gpu_uuids)
    assert all(s.gpu.uuid in got or s.gpu.index >= 2 for s in small.gpus())
    assert not {s.gpu.uuid for s in small.gpus() if s.gpu.index >= 2 and not s.present} & {
        u for l in lent if l for u in l.gpu_uuids}
    # The lease on a GPU that disappeared runs on until it ends.
    assert small.lease(held.id).ended_at is None


def test_static_list_with_several_hosts_never_spans_hosts(tmp_path):
    inv = StaticInventory(host="a", gpus_list=[
        {"uuid": "GPU-a0", "index": 0}, {"uuid": "GPU-a1", "index": 1},
    ])
    p = GPUPool(inventory=inv, db_url=f"sqlite:///{tmp_path / 'l.sqlite'}")
    p.sync_inventory()
    other = StaticInventory(host="b", gpus_list=[{"uuid": "GPU-b0", "index": 0}])
    GPUPool(inventory=other, db_url=p.db_url).sync_inventory()
    # A pool without inventory sees every host; a lease never spans them.
    admin = GPUPool(db_url=p.db_url)
    lease = admin.try_acquire("alice", "", 2)
    assert lease.host == "a"
    with pytest.raises(Unsatisfiable, match="largest host has 2 GPUs"):
        admin.try_acquire("bob", "", 3)
    one = admin.try_acquire("bob", "", 1)
    assert one.host == "b"
    assert admin.try_acquire("carol", "", 1, host="b") is None


def test_the_database_rejects_a_second_active_lease_on_one_gpu(pool):
    gpu = uuids(pool)[0]
    engine = pool._engine_ready()
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for lease_id in (101, 102):
            conn.execute(insert(leases_table).values(
                id=lease_id, user_name="x", server_name="", host=HOST, groups="[]", started_at=now))
        conn.execute(insert(lease_gpus_table).values(lease_id=101, uuid=gpu, host=HOST, position=0))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(lease_gpus_table).values(lease_id=102, uuid=gpu, host=HOST, position=0))
    # Ended rows do not count: history may hold many leases of one GPU.
    with engine.begin() as conn:
        conn.execute(insert(lease_gpus_table).values(lease_id=102, uuid=gpu, host=HOST, position=0, ended_at=now))


def test_a_locked_ledger_gives_a_clear_error_and_nothing_half_written(tmp_path):
    pool = make_pool(tmp_path, lock_timeout=0.2)
    pool.counts()  # create the schema
    blocker = sqlite3.connect(tmp_path / "ledger.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(PoolUnavailable, match="locked for more than 0.2 s") as info:
            pool.try_acquire("alice", "", 1)
        assert info.value.status_code == 503
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert pool.history() == []
    assert pool.try_acquire("alice", "", 1) is not None


def test_an_unreachable_database_hides_the_password():
    pool = GPUPool(db_url="postgresql+psycopg://hub:s3cret-pw@127.0.0.1:1/ledger", connect_timeout=1)
    with pytest.raises(PoolUnavailable) as info:
        pool.leases()
    assert "s3cret-pw" not in str(info.value)
    assert "hub:***@127.0.0.1:1/ledger" in str(info.value)


def test_an_unwritable_sqlite_path_is_unavailable(tmp_path):
    pool = GPUPool(db_url=f"sqlite:///{tmp_path}/no/such/dir/ledger.sqlite")
    with pytest.raises(PoolUnavailable, match="unavailable"):
        pool.try_acquire("alice", "", 1)


@pytest.mark.parametrize(
    "option, value",
    [("db_url", "not a url"), ("db_url", "mysql://x/y"), ("max_gpus_per_user", -1),
     ("group_gpu_limits", {"ml": -2}), ("lock_timeout", 0), ("backfill_window", -1)],
)
def test_bad_configuration_is_refused(option, value):
    from traitlets import TraitError

    with pytest.raises(TraitError):
        GPUPool(**{option: value})


def test_state_survives_a_new_pool_object(tmp_path):
    first = make_pool(tmp_path)
    lease = first.try_acquire("alice", "", 2)
    first.drain(uuids(first)[3])
    first.close()
    second = make_pool(tmp_path)
    assert second.lease(lease.id) == lease
    assert [s.state for s in second.gpus()].count("drained") == 1


def test_hand_written_sqlite_statements_agree_with_core(tmp_path):
    # The hot path runs hand-written SQL on SQLite and Core elsewhere: the
    # same story told through both must leave the same ledger.
    results = []
    for fast in (True, False):
        pool = make_pool(tmp_path, name=f"{fast}.sqlite", max_gpus_per_user=3, backfill_window=0)
        pool._engine_ready()
        pool._fast_sqlite = fast
        a = pool.try_acquire("alice", "", 2, groups=["ml"])
        b = pool.try_acquire("bob", "x", 2)
        with pytest.raises(QuotaExceeded):
            pool.try_acquire("alice", "more", 2)
        pool.release(a.id, "culled")
        c = pool.try_acquire("carol", "", 1)
        results.append([(l.user, l.server_name, len(l.gpu_uuids), l.groups, l.end_reason, l.ended_at is None)
                        for l in pool.history()])
        assert set(c.gpu_uuids) <= set(a.gpu_uuids) and pool.lease(b.id).active
    assert results[0] == results[1]
