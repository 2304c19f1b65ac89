"""Fair-share: the queue's order by recent use, its explanations, and the rolled-up history it reads.

History is inserted at past times and rolled up by the ledger's own function
(rollup.record_ended, which every path that ends a lease calls), on a real
SQLite ledger here and on PostgreSQL in tests/integration/test_pool_fairshare_postgres.py.
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text

from devservices.waiting import async_until as until
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool, lease_gpus_table, leases_table
from spawner.pool.history import queries, rollup
from spawner.pool.leasing.serving_order import FIFO, Shares, order, standing

HOST = "node-1"
H = timedelta(hours=1)


def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


def make_pool(url: str, gpus: int = 1, **kwargs) -> GPUPool:
    kwargs.setdefault("poll_interval", 0.05)
    pool = GPUPool(inventory=SimulatedInventory(count=gpus, host=HOST), db_url=url, **kwargs)
    pool.sync_inventory()
    return pool


def past_lease(pool: GPUPool, user: str, start: datetime, end: datetime | None, gpus: int = 1,
               groups: tuple[str, ...] = ()) -> int:
    """A lease that ran at a past time (ended at `end`, or still active), as the ledger records it."""
    uuids = [s.gpu.uuid for s in pool.gpus() if end is not None or s.lease is None][:gpus]

    def write(conn):
        lid = conn.execute(insert(leases_table).values(
            user_name=user, server_name="", host=HOST, groups=json.dumps(list(groups)), started_at=start,
            ended_at=end, end_reason="stopped" if end else None)).inserted_primary_key[0]
        conn.execute(insert(lease_gpus_table), [{"lease_id": lid, "uuid": u, "host": HOST, "position": i,
                                                 "ended_at": end} for i, u in enumerate(uuids)])
        if end is not None:
            rollup.record_ended(pool._store, conn, [lid])
        return lid
    return pool._write(write)


# --- the order, as a pure function ----------------------------------------------------


class E:
    def __init__(self, id, user, enqueued_at, groups=(), count=1):
        self.id, self.user, self.enqueued_at, self.groups, self.count = id, user, enqueued_at, groups, count


def test_order_is_by_standing_then_arrival_and_overdue_requests_go_first():
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    use = {"heavy": 20.0, "light": 2.0}
    shares = Shares({}, {}, fifo_after=120)
    s = lambda e: standing(e.user, e.groups, use, {}, shares)  # noqa: E731
    heavy, light, fresh = E(1, "heavy", now - timedelta(seconds=60)), E(2, "light", now), E(3, "new", now)
    assert [e.user for e in order([heavy, light, fresh], "fairshare", s, now, 120)] == ["new", "light", "heavy"]
    assert [e.user for e in order([heavy, light, fresh], FIFO, s, now, 120)] == ["heavy", "light", "new"]
    # heavy has waited past fifo_after: passed no more
    late = now + timedelta(seconds=61)
    assert [e.user for e in order([heavy, light, fresh], "fairshare", s, late, 120)] == ["heavy", "new", "light"]


def test_shares_and_group_use_change_the_standing():
    shares = Shares({"alice": 4}, {"course": 1}, fifo_after=60)
    assert standing("alice", (), {"alice": 8.0}, {}, shares) == 2.0
    # a listed group's use counts for each member; an unlisted one does not
    assert standing("bob", ("course", "everyone"), {"bob": 1.0}, {"course": 5.0, "everyone": 99.0}, shares) == 6.0


def test_decayed_hours_halve_per_half_life():
    t = datetime(2026, 3, 1, tzinfo=UTC)
    week = 7 * 86400.0
    fresh = rollup.decayed_hours(t - timedelta(minutes=1), t, 1, t, week)
    old = rollup.decayed_hours(t - timedelta(days=7, minutes=1), t - timedelta(days=7), 1, t, week)
    assert abs(fresh - 1 / 60) < 1e-6 and abs(old / fresh - 0.5) < 1e-3
    assert rollup.hours_of(t - timedelta(minutes=90), t, 2) == [(t - 2 * H, 1800.0 * 2), (t - H, 3600.0 * 2)]


# --- rolled-up usage equals the exact sum over leases ----------------------------------


def usage_matches_the_exact_sum(url: str) -> None:
    pool = make_pool(url, gpus=4)
    rng = random.Random(5)
    now = datetime.now(UTC)
    for i in range(120):
        start = now - timedelta(seconds=rng.uniform(60, 5 * 86400))
        end = min(now - timedelta(seconds=1), start + timedelta(seconds=rng.uniform(30, 9 * 3600)))
        past_lease(pool, f"u{i % 7}", start, end, gpus=rng.choice([1, 2]), groups=(f"g{i % 3}",))
    past_lease(pool, "active", now - 3 * H, None, gpus=1, groups=("g0",))
    windows = [(None, None), (now - timedelta(days=2), None), (now - timedelta(days=4, minutes=17), now - 5 * H),
               (now - timedelta(days=3), now - timedelta(days=1)), (None, now - timedelta(days=2, minutes=3)),
               (now - timedelta(minutes=50), now - timedelta(minutes=10)), (now - timedelta(days=30), now - 40 * H)]
    for since, until_ in windows:
        got = pool.usage(since, until_)
        want = queries.usage(pool.history(since=since, until=until_), since, until_)
        for kind in ("users", "groups"):
            assert set(k for k, v in got[kind].items() if v > 1e-9) == set(k for k, v in want[kind].items() if v > 1e-9)
            for k, v in want[kind].items():
                # active leases count up to "now", read a moment apart by the two sums
                assert abs(got[kind].get(k, 0.0) - v) < 1e-3, (since, until_, kind, k)
    pool.close()


def test_usage_from_the_rollups_matches_the_leases(tmp_path):
    usage_matches_the_exact_sum(sqlite_url(tmp_path))


def test_an_upgraded_ledger_rolls_up_its_history_once(tmp_path):
    url = sqlite_url(tmp_path)
    pool = make_pool(url, gpus=2)
    now = datetime.now(UTC)
    past_lease(pool, "alice", now - 30 * H, now - 10 * H, gpus=2, groups=("lab",))
    want = pool.usage()
    engine = pool._engine_ready()
    with engine.begin() as conn:  # the ledger as the release before left it (schema 7): no rollups
        for table in ("gpu_pool_lease_hours", "gpu_pool_usage_hours", "gpu_pool_usage_days", "gpu_pool_lent_hours"):
            conn.execute(text(f"DROP TABLE {table}"))
        conn.execute(text("DROP TABLE gpu_pool_decayed_use"))
        for index in ("ix_gpu_pool_leases_ended", "ix_gpu_pool_lease_gpus_ended", "ix_gpu_pool_queue_log_left"):
            conn.execute(text(f"DROP INDEX {index}"))
        conn.execute(text("DELETE FROM gpu_pool_meta WHERE key = 'decayed_use_half_life_s'"))
        conn.execute(text("UPDATE gpu_pool_meta SET value = '7' WHERE key = 'schema_version'"))
    pool.close()
    again = make_pool(url, gpus=2)
    assert again.usage() == want and abs(want["users"]["alice"] - 40.0) < 1e-6
    assert 0 < again.recent_use().users["alice"] < 40.0  # decayed
    again.close()


# --- the queue serves the lighter user first, and the heavier after fifo_after -----------


def lighter_user_first(url: str, fifo_after: float) -> tuple[str, list[str]]:
    """heavy (20 recent GPU-hours) queues before light (2) for the only GPU; returns who got it,
    and what heavy was told while waiting."""
    pool = make_pool(url, gpus=1, fifo_after=fifo_after)
    now = datetime.now(UTC)
    past_lease(pool, "heavy", now - 22 * H, now - 2 * H)
    past_lease(pool, "light", now - 4 * H, now - 2 * H)
    holder = pool.try_acquire("carol", "", 1)
    told: list[str] = []

    async def main():
        heavy = asyncio.ensure_future(pool.acquire("heavy", "", 1, timeout=30,
                                                   on_wait=lambda p, w, f, why: told.append(why)))
        await until(lambda: [w.user for w in pool.queue()] == ["heavy"])
        light = asyncio.ensure_future(pool.acquire("light", "", 1, timeout=30))
        await until(lambda: len(pool.queue()) == 2)
        if fifo_after < 30:
            # heavy's wait passes fifo_after: the queue goes by arrival from then on
            await until(lambda: [w.user for w in pool.queue()] == ["heavy", "light"])
        else:
            assert [w.user for w in pool.queue()] == ["light", "heavy"]
            await until(lambda: any(t.startswith("2nd") for t in told))
        pool.release(holder.id)
        done, _ = await asyncio.wait({heavy, light}, return_when=asyncio.FIRST_COMPLETED)
        winner = done.pop().result()
        pool.release(winner.id)
        await asyncio.gather(heavy, light)
        return winner.user

    try:
        return asyncio.run(main()), told
    finally:
        pool.close()


def test_the_lighter_user_is_served_first_and_told_why(tmp_path):
    winner, told = lighter_user_first(sqlite_url(tmp_path), fifo_after=600)
    assert winner == "light"
    second = next(t for t in told if t.startswith("2nd"))
    assert second.startswith("2nd in the queue: 1 request from someone with less recent GPU use is ahead of you; "
                             "your recent GPU use: 1")  # about 19 GPU-hours after 2 h of decay
    assert "GPU-hours (half-life 7 days)" in second and "light" not in second


def test_the_heavier_user_is_served_in_arrival_order_after_fifo_after(tmp_path):
    winner, _ = lighter_user_first(sqlite_url(tmp_path), fifo_after=1.0)
    assert winner == "heavy"


def test_fifo_order_ignores_use(tmp_path):
    pool = make_pool(sqlite_url(tmp_path), gpus=1, queue_order="fifo")
    now = datetime.now(UTC)
    past_lease(pool, "heavy", now - 22 * H, now - 2 * H)
    holder = pool.try_acquire("carol", "", 1)

    async def main():
        heavy = asyncio.ensure_future(pool.acquire("heavy", "", 1, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        light = asyncio.ensure_future(pool.acquire("light", "", 1, timeout=30))
        await until(lambda: len(pool.queue()) == 2)
        assert [w.why for w in pool.queue()] == ["1st in the queue: next to be served",
                                                 "2nd in the queue: 1 request that came earlier is ahead of you"]
        pool.release(holder.id)
        first = await heavy
        pool.release(first.id)
        await light
    asyncio.run(main())
    pool.close()


def test_gpu_pool_fairshare_prints_use_share_and_priority(tmp_path, capsys):
    from spawner.cli import main

    url = sqlite_url(tmp_path)
    pool = make_pool(url, gpus=2)
    now = datetime.now(UTC)
    past_lease(pool, "heavy", now - 22 * H, now - 2 * H, groups=("lab",))
    past_lease(pool, "light", now - 4 * H, now - 2 * H)
    pool.close()
    assert main(["--db-url", url, "fairshare"]) == 0
    out = capsys.readouterr().out
    assert "Queue order: fairshare" in out and "USER" in out and "PRIORITY" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("heavy", "light"))}
    assert float(lines["heavy"][1]) > float(lines["light"][1]) and float(lines["heavy"][2]) == 20.0
    assert float(lines["heavy"][5]) < float(lines["light"][5])  # less priority
    assert main(["--db-url", url, "--json", "fairshare"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {u["user"] for u in data["users"]} == {"heavy", "light"}
    assert data["groups"] == [{"group": "lab", "recent_gpu_hours": data["groups"][0]["recent_gpu_hours"],
                               "share": None, "counts": False, "standing": None}]


# --- GPU-hour budgets ---------------------------------------------------------------------


def budget_refuses_and_ends(url: str) -> None:
    from spawner.culling.policy import GPUCullPolicy, LedgerBudgets
    from spawner.pool import QuotaExceeded

    pool = make_pool(url, gpus=4, gpu_hour_budget=40)
    now = datetime.now(UTC)
    past_lease(pool, "alice", now - timedelta(days=3), now - timedelta(days=3) + 20 * H, gpus=2)  # 40 GPU-h
    with pytest.raises(QuotaExceeded) as refused:
        pool.try_acquire("alice", "", 1)
    assert str(refused.value).startswith("You have used 40.0 of your 40 GPU-hours in the last 7 days; "
                                         "the next hour frees on ")
    assert refused.value.status_code == 403
    assert pool.try_acquire("bob", "", 1) is not None  # others are not held back
    # A lease that runs past its budget: the culler's check marks it, and its end says `budget`.
    lid = past_lease(pool, "carol", now - 41 * H, None, gpus=1)
    (standing,) = pool.budget_standings("carol")
    assert standing.exhausted and standing.used > 40
    server = {"name": "", "url": "/user/carol/", "state": {"gpu_lease_id": lid, "gpu_uuids": ["x"]}}
    verdict = GPUCullPolicy(3600, 900, over_budget=LedgerBudgets(pool)).decide(timedelta(seconds=5), server)
    assert verdict.cull and "You have used 41.0 of your 40 GPU-hours in the last 7 days" in verdict.reason
    assert verdict.end_reason == "budget"
    # The culler records its intent before its DELETE; the spawner reads it at the stop and ends
    # the lease with it (spawner/lending/spawner.py), as here.
    assert pool.record_end_intent(lid, verdict.end_reason, "idle-culler")
    reason, _ = pool.end_intent(lid)
    pool.release(lid, reason)
    assert pool.lease(lid).end_reason == "budget"
    # Within budget: a running server is shown when it would run out, and is not culled for it.
    dave = past_lease(pool, "dave", now - 10 * H, None, gpus=1)
    (standing,) = pool.budget_standings("dave")
    assert not standing.exhausted and standing.runs_out_at is not None
    assert abs((standing.runs_out_at - now).total_seconds() / 3600 - 30) < 0.1
    dave_server = {"name": "", "url": "/user/dave/", "state": {"gpu_lease_id": dave, "gpu_uuids": ["x"]}}
    assert not GPUCullPolicy(3600, 900, over_budget=LedgerBudgets(pool)).decide(timedelta(seconds=5), dave_server).cull
    # A reader of the ledger (the culler's own pool, no config) sees the lending hub's budgets.
    reader = GPUPool(db_url=url)
    assert reader.budgets().user == 40 and reader.budget_standings("alice")[0].exhausted
    reader.close()
    pool.close()


# Group names that a LIKE pattern misreads: a non-ASCII letter and a quote or backslash (JSON
# escapes them, and PostgreSQL's LIKE takes a backslash as its escape), LIKE's own wildcard `_`,
# and a case that SQLite's LIKE ignores; beside lookalikes that must not count for them.
GROUP_HOURS = {"équipe-ml": 1, "ml_team": 2, "mlXteam": 4, "ML": 8, "ml": 16, 'a"b': 32, "a\\b": 64}


def group_budgets_match_groups_exactly(url: str) -> None:
    budgets = {g: 1000.0 for g in GROUP_HOURS}
    pool = make_pool(url, gpus=1, group_gpu_hour_budgets=budgets)
    now = datetime.now(UTC)
    start = now - timedelta(days=6)
    for i, (group, hours) in enumerate(GROUP_HOURS.items()):
        past_lease(pool, f"u{i}", start, start + hours * H, groups=(group,))
    # A lease of two groups counts for each of them, once.
    past_lease(pool, "two", start, start + 128 * H, groups=("x", "ml_team"))
    used = {}
    for group in GROUP_HOURS:
        (standing,) = pool.budget_standings("someone", [group])
        used[group] = round(standing.used, 3)
    assert used == {**GROUP_HOURS, "ml_team": 2 + 128}
    pool.close()


def test_group_budgets_count_the_hours_of_exactly_their_group(tmp_path):
    group_budgets_match_groups_exactly(sqlite_url(tmp_path))


def test_a_budget_with_some_left_never_reads_as_used_up():
    from spawner.pool.fair_use.budget import Standing

    week = 7 * 86400.0
    assert Standing("you", 39.96, 40, None, None).message(week).startswith("You have used 39.9 of your 40 GPU-hours")
    assert Standing("you", 40.0, 40, None, None).message(week).startswith("You have used 40.0 of your 40 GPU-hours")
    assert Standing("group 'lab'", 12.34, 40, None, None).message(week) == \
        "Group 'lab' has used 12.3 of group 'lab''s 40 GPU-hours in the last 7 days"


def test_a_budget_refuses_with_its_numbers_and_ends_a_lease_that_runs_past_it(tmp_path):
    budget_refuses_and_ends(sqlite_url(tmp_path))
