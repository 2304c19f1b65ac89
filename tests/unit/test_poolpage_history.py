"""Usage over time: the ledger's record (leases, drains, the queue log), its series and charts."""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from devservices.waiting import async_until
from spawner.culling.deadline import CullRules, deadline
from spawner.culling.policy import cull_deadline
from spawner.inventory import SimulatedInventory
from spawner.pool import EndReason, GPUPool
from spawner.pool.history.timeline import Timeline
from spawner.poolpage import charts, occupancy

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)
SVG = "{http://www.w3.org/2000/svg}"


def test_series_are_time_weighted_means_per_bucket():
    tl = Timeline(T0, T0 + 4 * H, gpus=4,
                  lent={("n", "a"): [(T0, T0 + 2 * H)], ("n", "b"): [(T0 + 1.5 * H, T0 + 4 * H)]},
                  drained={("n", "c"): [(T0, T0 + 4 * H)],
                           # drained while lent: counts as lent, not twice
                           ("n", "b"): [(T0 + 3 * H, T0 + 4 * H)]},
                  queue=[((T0 + 1 * H, T0 + 1.5 * H), 2)])
    s = occupancy.series(tl, buckets=4)
    assert s["lent"] == [1.0, 1.5, 1.0, 1.0]
    assert s["drained"] == [1.0, 1.0, 1.0, 1.0]
    assert s["free"] == [2.0, 1.5, 2.0, 2.0]
    assert s["queue"] == [0.0, 0.5, 0.0, 0.0] and s["queue_gpus"] == [0.0, 1.0, 0.0, 0.0]
    assert s["times"][1] == (T0 + H).isoformat() and s["step_s"] == 3600
    csv = occupancy.series_csv(s).splitlines()
    assert csv[0] == "bucket_start,lent,drained,free,queue,queue_gpus"
    assert csv[2] == f"{(T0 + H).isoformat()},1.500,1.000,1.500,0.500,1.000"


def test_subtract_cuts_out_overlaps():
    spans = [(T0, T0 + 4 * H)]
    assert occupancy.subtract(spans, [(T0 + H, T0 + 2 * H)]) == [(T0, T0 + H), (T0 + 2 * H, T0 + 4 * H)]
    assert occupancy.subtract(spans, [(T0 - H, T0 + 5 * H)]) == []


def test_the_occupancy_chart_stacks_its_layers_to_the_pool_size():
    svg = charts.area_chart("c", "t <&>", ["2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00"],
                            [("lent", [1.0, 2.0]), ("free", [3.0, 2.0])], "GPUs", 3600, y_max=4)
    root = ET.fromstring(svg)  # well-formed XML, title escaped
    assert root.find(f"{SVG}title").text == "t <&>"
    layers = {p.get("data-layer"): p.get("points") for p in root.iter(f"{SVG}polygon")}
    assert set(layers) == {"lent", "free"}
    # the stack's top is 4 GPUs = the plot's top edge in both buckets
    tops = [float(pt.split(",")[1]) for pt in layers["free"].split()[:4]]
    assert tops == [charts.TOP] * 4


def test_bar_chart_escapes_names_and_orders_by_value():
    svg = charts.bar_chart("u", "GPU-hours", [("<script>", 1.0), ("bob", 3.5)], "h")
    assert "<script>" not in svg
    bars = [(r.get("data-name"), float(r.get("data-value")), float(r.get("width")))
            for r in ET.fromstring(svg).iter(f"{SVG}rect")]
    assert [b[0] for b in bars] == ["bob", "<script>"] and bars[0][2] > 3 * bars[1][2]
    assert "No GPU use" in charts.bar_chart("u", "t", [], "h")


def test_the_ledger_records_leases_drains_and_the_queue_over_time(tmp_path):
    records_over_time(f"sqlite:///{tmp_path / 'l.sqlite'}")


def records_over_time(url: str) -> None:
    """Leases, a drain and a queued request, read back as intervals (also run on PostgreSQL)."""
    pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=2), poll_interval=0.05)
    start = datetime.now(UTC) - timedelta(seconds=1)
    try:
        pool.sync_inventory()
        a = pool.try_acquire("alice", "", 2)

        async def wait_then_get():
            task = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=10))
            # bob waits 0.3 s from when the queue has him (under load his record comes late)
            await async_until(lambda: len(pool.queue()) == 1, what="bob in the queue")
            await asyncio.sleep(0.3)  # the length of bob's wait is what the record must show
            assert len(pool.queue()) == 1
            pool.release(a.id, EndReason.STOPPED)
            return await task

        b = asyncio.run(wait_then_get())
        pool.drain(pool.gpus()[0].gpu.uuid, by="ada")
        tl = pool.timeline(start)
        assert tl.gpus == 2
        assert sorted(len(v) for v in tl.lent.values()) == [1, 2]  # alice's two, then bob's one
        assert len(tl.drained) == 1 and len(tl.queue) == 1 and tl.queue[0][1] == 1
        (queued_from, queued_to), _ = tl.queue[0]
        assert timedelta(seconds=0.2) < queued_to - queued_from < timedelta(seconds=5)
        assert pool.lease_lengths() and len(pool.lease_lengths()) == 1  # bob's still runs
        s = occupancy.series(tl, buckets=1)
        assert 0 < s["queue"][0] < 1 and 0 < s["lent"][0] <= 2
        pool.release(b.id)
    finally:
        pool.close()


def test_wait_estimates_follow_lease_lengths_and_cull_deadlines():
    from spawner.poolpage import estimate

    now = T0 + 10 * H
    lengths = [3600.0, 7200.0, 10800.0]  # past leases: 1, 2, 3 h
    holdings = [estimate.Holding(now - 0.5 * H, 1),  # median of all three: back in 1.5 h
                estimate.Holding(now - 2.5 * H, 2),  # only the 3 h one ran as long: back in 0.5 h
                estimate.Holding(now - 0.1 * H, 1, cull_at=now + 0.25 * H)]  # idle: culled in 15 min
    # 1st waiter (1 GPU): the culled one; 2nd (2 GPUs): the 2-GPU lease; 3rd: the last one; 4th: unknown
    got = estimate.waits([1, 2, 1, 1], 0, holdings, now, lengths)
    assert got == [900.0, 1800.0, 5400.0, None]
    assert estimate.waits([1], 1, holdings, now, lengths) == [0.0]  # one free now
    # The same, played forward with the reason of each estimate.
    holdings[2] = estimate.Holding(now - 0.1 * H, 1, cull_at=now + 0.25 * H,
                                   cull_reason="alice's idle server is culled at 10:15 UTC if it stays idle")
    explained = estimate.waits_explained([1, 2, 1, 1], 0, holdings, now, lengths)
    assert explained == [(900.0, "alice's idle server is culled at 10:15 UTC if it stays idle"),
                         (1800.0, "a lease of typical length ends"), (5400.0, "a lease of typical length ends"),
                         (None, "nothing lent is expected back")]
    assert estimate.waits([1], 0, [estimate.Holding(now - 9 * H, 1)], now, lengths) == [None]  # longer than any
    assert [estimate.say(s) for s in (None, 30, 1500, 5400 * 2)] == [
        "unknown", "soon (estimate)", "about 25 min (estimate)", "about 3.0 h (estimate)"]
    rules = CullRules(3600, 900)
    assert deadline(rules, last_activity=now, started=now, is_gpu=True, profile=None,
                    contended=False).at == now + timedelta(seconds=900)
    assert deadline(CullRules(0, 0), last_activity=now, started=now, is_gpu=True, profile=None,
                    contended=False).at is None
    gpu = {"gpu_lease_id": 7, "gpu_uuids": ["GPU-1"]}
    assert cull_deadline(now, gpu, 3600, 900) == now + timedelta(seconds=900)
    assert cull_deadline(now, {}, 3600, 900) == now + timedelta(seconds=3600)
    assert cull_deadline(now, gpu, 3600, 0) is None
    assert cull_deadline(None, gpu, 3600, 900) is None


def test_action_script_targets_and_limits():
    from spawner.poolpage import scripts
    from spawner.services.hub_api import Server, servers_of

    user = {"name": "pat", "groups": ["ml"], "servers": {
        "": {"ready": True, "state": {"profile": "tf-gpu-1", "gpu_lease_id": 4, "gpu_uuids": ["GPU-a"]},
             "last_activity": "2026-01-01T00:00:00Z"},
        "big": {"ready": False, "user_options": {"profile": "tf-gpu-2"}, "last_activity": None}}}
    mine = servers_of(user)
    assert [(s.label, s.profile, s.lease_id) for s in mine] == [("pat", "tf-gpu-1", 4), ("pat/big", "tf-gpu-2", None)]
    assert mine[0].last_activity == datetime(2026, 1, 1, tzinfo=UTC)
    servers = mine + [Server("bob", "", ("ml",), "tf-cpu", True)]
    pick = lambda **kw: [s.label for s in scripts.select_servers(servers, scripts.parse_target(**kw))]  # noqa: E731
    assert pick(profile="tf-gpu-1", group=None, users=None) == ["pat"]
    assert pick(profile=None, group="ml", users=None) == ["bob", "pat"]  # pat/big is not ready
    assert pick(profile=None, group=None, users="bob, pat,bob") == ["bob", "pat"]
    for bad in ({"profile": "a", "group": "b", "users": None}, {"profile": "", "group": " ", "users": []}):
        with pytest.raises(scripts.BadScript, match="exactly one target"):
            scripts.parse_target(**bad)
    for script, timeout, message in [("", 5, "empty"), ("x" * (65 * 1024), 5, "longer"),
                                     ("id", 0, "between"), ("id", "soon", "whole number")]:
        with pytest.raises(scripts.BadScript, match=message):
            scripts.check_script(script, timeout)
    assert scripts.check_script("id", "30") == ("id", 30)
    text, cut = scripts.cap(b"x" * (scripts.OUTPUT_CAP + 10))
    assert cut and len(text) == scripts.OUTPUT_CAP and scripts.cap(b"ok") == ("ok", False)


def test_count_axes_have_whole_numbers_on_their_grid_lines():
    assert [charts._nice_max(v) for v in (0.3, 4, 5, 9, 21, 41)] == [4, 4, 8, 20, 40, 80]
    svg = charts.area_chart("q", "queue", ["2026-01-01T00:00:00+00:00"], [("queue", [0.4])], "waiting", 60)
    labels = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")][:5]
    assert labels == ["0", "1", "2", "3", "4"]


def test_a_long_periods_chart_from_the_hourly_rollup_matches_the_leases(tmp_path):
    hourly_series_match_the_leases(f"sqlite:///{tmp_path / 'l.sqlite'}")


def hourly_series_match_the_leases(url: str) -> None:
    """The lent GPUs drawn from the hourly rollup equal those drawn from every lease: exactly in
    hour-aligned buckets, and with the same GPU-hours over a period that ends now (an active
    lease, a lease ended this hour, a drained GPU lent meanwhile). Also run on PostgreSQL."""
    from sqlalchemy import insert, text

    from spawner.pool.history import rollup
    from spawner.pool.ledger.schema import lease_gpus_table, leases_table

    pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=4, host="n"), poll_interval=0.05)
    try:
        pool.sync_inventory()
        now = datetime.now(UTC)
        gpus = [s.gpu for s in pool.gpus()]
        this_hour = now.replace(minute=0, second=0, microsecond=0)
        spans = [(now - timedelta(hours=40, minutes=17), now - timedelta(hours=37, minutes=2), 2),
                 (now - timedelta(hours=30, minutes=5), now - timedelta(hours=29, minutes=58), 1),  # 7 min
                 (now - timedelta(hours=3, minutes=30), max(this_hour, now - timedelta(minutes=1)), 1)]
        with pool._engine_ready().begin() as conn:
            for i, (start, end, n) in enumerate(spans, 1):
                lid = conn.execute(insert(leases_table).values(
                    user_name=f"u{i}", server_name="", host="n", groups="[]", started_at=start, ended_at=end,
                    end_reason="stopped")).inserted_primary_key[0]
                conn.execute(insert(lease_gpus_table), [dict(lease_id=lid, uuid=g.uuid, host="n", position=p,
                                                             ended_at=end) for p, g in enumerate(gpus[:n])])
            rollup.backfill(conn)
        active = pool.try_acquire("ann", "", 1)  # lent since now, to the period's end
        pool.drain(active.gpu_uuids[0], by="ada")  # drained while lent: counts as lent
        # Hour-aligned: the same numbers, bucket by bucket.
        start, end = this_hour - timedelta(hours=48), this_hour
        exact = occupancy.series(pool.timeline(start, end), buckets=24)
        hourly = occupancy.series(pool.timeline(start, end, hourly=True), buckets=24)
        assert [round(x, 6) for x in hourly["lent"]] == [round(x, 6) for x in exact["lent"]]
        assert sum(exact["lent"]) > 0
        # Ending now (the current hour and the active lease exact): the same GPU-hours in all.
        start = now - timedelta(days=2)
        exact = occupancy.series(pool.timeline(start), buckets=32)
        hourly = occupancy.series(pool.timeline(start, hourly=True), buckets=32)
        # (each bucket is rounded to 0.001 GPU; the two reads are a moment apart)
        assert abs(sum(hourly["lent"]) - sum(exact["lent"])) < 32 * 0.001 and sum(exact["lent"]) > 1
        assert hourly["drained"] == exact["drained"] and hourly["free"][-1] == exact["free"][-1]
        # A lease ended through the pool is rolled up as it ends; a ledger of schema 8 (no
        # pool-wide hours yet) gets them from its users' hours when it is opened.
        def lent_seconds() -> float:
            with pool._engine_ready().connect() as conn:
                return conn.execute(text("SELECT COALESCE(SUM(gpu_seconds), 0) FROM gpu_pool_lent_hours")).scalar()
        before = lent_seconds()
        pool.release(active.id)
        ended = pool.lease(active.id)  # its GPU-seconds, added to the pool's hours as it ends
        assert abs(lent_seconds() - before - (ended.ended_at - ended.started_at).total_seconds()) < 1e-3

        def same_total() -> bool:
            until = datetime.now(UTC)
            exact = occupancy.series(pool.timeline(start, until), buckets=32)
            hourly = occupancy.series(pool.timeline(start, until, hourly=True), buckets=32)
            return abs(sum(hourly["lent"]) - sum(exact["lent"])) < 32 * 0.001
        assert same_total()
        # From schema 8 and from 9 (the readings' memory column, before the pool-wide hours).
        for version in ("8", "9"):
            with pool._engine_ready().begin() as conn:
                conn.execute(text("DELETE FROM gpu_pool_lent_hours"))
                conn.execute(text(f"UPDATE gpu_pool_meta SET value = '{version}' WHERE key = 'schema_version'"))
            pool.close()
            pool = GPUPool(db_url=url, inventory=SimulatedInventory(count=4, host="n"), poll_interval=0.05)
            assert lent_seconds() > 0 and same_total(), version
    finally:
        pool.close()
