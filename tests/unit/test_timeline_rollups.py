"""The queue chart from the queue's hourly rollup, and the drained series bounded to the period
(SQLite here; tests/integration/test_pool_timeline_postgres.py runs them on PostgreSQL)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, insert, text, update

from devservices.waiting import async_until
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool
from spawner.pool.ledger.schema import audit_table, gpus_table, queue_log_table
from spawner.poolpage import occupancy

pytestmark = pytest.mark.unit

H = timedelta(hours=1)


def make_pool(url: str) -> GPUPool:
    return GPUPool(db_url=url, inventory=SimulatedInventory(count=2, host="n"), poll_interval=0.05)


def queued_seconds(pool: GPUPool) -> float:
    with pool._engine_ready().connect() as conn:
        return conn.execute(text("SELECT COALESCE(SUM(request_seconds), 0) FROM gpu_pool_queued_hours")).scalar()


def queue_chart_from_the_rollup(url: str) -> None:
    """Requests that left in past hours are drawn from gpu_pool_queued_hours (filled on upgrade
    from schema 10, and as each request leaves), the same as from the queue's log; the log's old
    rows are no longer read for it."""
    pool = make_pool(url)
    try:
        pool.sync_inventory()
        now = datetime.now(UTC)
        this_hour = now.replace(minute=0, second=0, microsecond=0)
        # Past requests, as a ledger of schema 10 holds them: 1 GPU for 2h10m, 2 GPUs for 7 min.
        spans = [(this_hour - timedelta(hours=30, minutes=40), this_hour - timedelta(hours=28, minutes=30), 1),
                 (this_hour - timedelta(hours=5, minutes=3), this_hour - timedelta(hours=4, minutes=56), 2)]
        with pool._engine_ready().begin() as conn:
            conn.execute(insert(queue_log_table), [
                dict(id=1000 + i, user_name=f"u{i}", count=n, enqueued_at=a, left_at=b, outcome="served")
                for i, (a, b, n) in enumerate(spans)])
            conn.execute(text("UPDATE gpu_pool_meta SET value = '10' WHERE key = 'schema_version'"))
        pool.close()
        pool = make_pool(url)  # the upgrade to 11 rolls the queue's record up
        assert abs(queued_seconds(pool) - (130 + 7) * 60) < 1e-3
        # A request that waits and is served now is added as it leaves.
        holder = pool.try_acquire("carol", "", 2)

        async def wait_then_get():
            task = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=10))
            await async_until(lambda: len(pool.queue()) == 1, what="bob in the queue")
            pool.release(holder.id)
            return await task

        before = queued_seconds(pool)
        bob = asyncio.run(wait_then_get())
        assert queued_seconds(pool) > before
        # Hour-aligned: bucket by bucket the same as from the log.
        start, end = this_hour - 48 * H, this_hour
        exact = occupancy.series(pool.timeline(start, end), buckets=48)
        hourly = occupancy.series(pool.timeline(start, end, hourly=True), buckets=48)
        assert [round(x, 6) for x in hourly["queue"]] == [round(x, 6) for x in exact["queue"]]
        assert [round(x, 6) for x in hourly["queue_gpus"]] == [round(x, 6) for x in exact["queue_gpus"]]
        # (each bucket is rounded to 0.001: 48 of them, to within 48 * 1.8 s)
        assert abs(sum(exact["queue"]) * 3600 - (130 + 7) * 60) < 90
        assert abs(sum(exact["queue_gpus"]) * 3600 - (130 * 60 + 2 * 7 * 60)) < 90
        # Ending now: bob's wait (this hour, exact) counts in both.
        until = datetime.now(UTC)
        exact_now = occupancy.series(pool.timeline(start, until), buckets=32)
        hourly_now = occupancy.series(pool.timeline(start, until, hourly=True), buckets=32)
        assert abs(sum(hourly_now["queue"]) - sum(exact_now["queue"])) < 32 * 0.001
        # The long period's chart reads the rollup, not the log's past rows.
        with pool._engine_ready().begin() as conn:
            conn.execute(text("DELETE FROM gpu_pool_queue_log WHERE id >= 1000"))
        again = occupancy.series(pool.timeline(start, end, hourly=True), buckets=48)
        assert again["queue"] == hourly["queue"] and sum(again["queue"]) > 2
        pool.release(bob.id)
    finally:
        pool.close()


def test_the_queue_chart_of_a_long_period_reads_the_hourly_rollup(tmp_path):
    queue_chart_from_the_rollup(f"sqlite:///{tmp_path / 'l.sqlite'}")


def drained_series_from_the_period(url: str) -> None:
    """A GPU drained before the period and undrained inside it, one drained before and still
    drained, one drained and undrained before: the drained series is right, and the audit is read
    from the period's start on, not from its beginning."""
    pool = make_pool(url)
    try:
        pool.sync_inventory()
        a, b = (s.gpu for s in pool.gpus())
        now = datetime.now(UTC)
        since = now - 24 * H
        with pool._engine_ready().begin() as conn:
            def rec(gpu, action, at):
                conn.execute(insert(audit_table).values(at=at, actor="ada", action=action, host=gpu.host,
                                                        uuid=gpu.uuid, detail=None))
            rec(a, "drain", since - 30 * H)
            rec(a, "undrain", since - 29 * H)  # before the period: nothing in it
            rec(a, "drain", since - 10 * H)
            rec(a, "undrain", since + 2 * H)  # drained for the period's first 2 h
            rec(b, "drain", since - 5 * H)  # drained all along
            conn.execute(update(gpus_table).where(gpus_table.c.uuid == b.uuid)
                         .values(drained=True, drained_at=since - 5 * H))
        statements: list[str] = []
        engine = pool._engine_ready()

        def seen(conn, cursor, statement, parameters, context, executemany):
            if "gpu_pool_audit" in statement:
                statements.append(statement)
        event.listen(engine, "before_cursor_execute", seen)
        try:
            tl = pool.timeline(since, now)
        finally:
            event.remove(engine, "before_cursor_execute", seen)
        assert tl.drained[(a.host, a.uuid)] == [(since, since + 2 * H)]
        assert tl.drained[(b.host, b.uuid)] == [(since, now)]
        assert statements and all("gpu_pool_audit.at >=" in s for s in statements), statements
    finally:
        pool.close()


def test_the_drained_series_reads_the_drains_of_its_period(tmp_path):
    drained_series_from_the_period(f"sqlite:///{tmp_path / 'l.sqlite'}")
