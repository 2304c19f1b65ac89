"""Waiting for GPUs: the fair queue, wake-ups, timeouts and cancellation (SQLite)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from devservices.waiting import async_until as until
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool, QuotaExceeded, Unsatisfiable, WaitTimeout, waiters_table

HOST = "node-1"


def make_pool(tmp_path, **kwargs) -> GPUPool:
    kwargs.setdefault("poll_interval", 0.05)
    return GPUPool(
        inventory=SimulatedInventory(count=4, host=HOST), db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", **kwargs
    )


def queue_rows(pool):
    with pool._engine_ready().connect() as conn:
        return conn.execute(select(waiters_table)).all()


def test_a_waiter_in_the_same_process_wakes_on_release(tmp_path):
    # Polling is set far beyond the wait's timeout: only the in-process
    # wake-up can serve this request in time.
    pool = make_pool(tmp_path, poll_interval=600)
    held = pool.try_acquire("alice", "", 4)
    positions = []

    async def main():
        task = asyncio.ensure_future(
            pool.acquire("bob", "", 2, timeout=30, on_wait=lambda *a: positions.append(a))
        )
        await until(lambda: positions)
        pool.release(held.id, "culled")
        return await task

    lease = asyncio.run(main())
    assert len(lease.gpu_uuids) == 2 and lease.user == "bob"
    assert positions == [(1, 2, 0)]  # 1st in the queue, wants 2, 0 free
    assert pool.queue() == [] and queue_rows(pool) == []


def test_timeout_says_what_happened_and_leaves_the_queue(tmp_path):
    pool = make_pool(tmp_path)
    pool.try_acquire("alice", "", 4)

    async def main():
        first = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        try:
            await pool.acquire("carol", "", 1, timeout=0.3)
        finally:
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first

    with pytest.raises(WaitTimeout) as info:
        asyncio.run(main())
    assert info.value.position == 2
    assert str(info.value).startswith("All 4 GPUs are lent; you were 2nd in the queue")
    assert "try again later" in str(info.value)
    assert info.value.status_code == 429
    assert queue_rows(pool) == []


def test_zero_timeout_never_queues(tmp_path):
    pool = make_pool(tmp_path)
    pool.try_acquire("alice", "", 4)
    with pytest.raises(WaitTimeout, match="1st in the queue"):
        asyncio.run(pool.acquire("bob", "", 1, timeout=0))
    assert queue_rows(pool) == []


def test_cancelled_wait_leaves_nothing_behind(tmp_path):
    pool = make_pool(tmp_path)
    held = pool.try_acquire("alice", "", 4)

    async def main():
        task = asyncio.ensure_future(pool.acquire("bob", "", 2, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert queue_rows(pool) == []
    assert [l.id for l in pool.history()] == [held.id]


def test_cancel_racing_a_grant_leaves_no_lease(tmp_path):
    # Cancel at many points of the first attempt; whatever the attempt had
    # done (queued, or granted) must be undone.
    pool = make_pool(tmp_path)

    async def main():
        for i in range(30):
            task = asyncio.ensure_future(pool.acquire("bob", f"s{i}", 1, timeout=30))
            for _ in range(i % 5):
                await asyncio.sleep(0)  # not a wait: moment i of the attempt, counted in loop turns
            task.cancel()
            try:
                lease = await task
            except asyncio.CancelledError:
                continue
            pool.release(lease.id, "stopped")  # it finished before the cancel landed

    asyncio.run(main())
    assert pool.leases() == []
    assert queue_rows(pool) == []


@pytest.mark.parametrize("held", [4, 0], ids=["waiting", "granting"])
def test_a_cancel_is_never_lost_whenever_it_lands(tmp_path, held):
    # JupyterHub cancels a pending spawn (start timeout, user's cancel); the
    # acquire must then raise CancelledError, not keep waiting or return a
    # lease nobody will use.  The moments vary: before the task starts, while
    # its database attempt runs in a thread, and - by blocking the loop until
    # that thread is done - after the attempt finished but before the task
    # resumed, where a cancel once went unnoticed.
    pool = make_pool(tmp_path, poll_interval=0.01)
    if held:
        pool.try_acquire("alice", "", held)
    kept = [l.id for l in pool.leases()]

    async def main():
        for i in range(24):
            task = asyncio.ensure_future(pool.acquire("bob", f"s{i}", 1, timeout=30))
            for _ in range(i % 3):
                await asyncio.sleep(0)  # not a wait: moment i of the attempt, counted in loop turns
            if i % 2:
                time.sleep(0.03)  # not a wait: the attempt's thread finishes while the loop is blocked
            elif i % 4 == 2:
                await asyncio.sleep(0.02)  # not a wait: a later attempt, or the wait between attempts
            if not task.cancel():  # granted before the cancel: the caller got it, a normal stop
                pool.release(task.result().id, "stopped")
                continue
            await asyncio.wait({task}, timeout=5)
            assert task.done(), f"moment {i}: the cancelled acquire kept waiting"
            with pytest.raises(asyncio.CancelledError):
                task.result()
            assert queue_rows(pool) == [], f"moment {i}"
            assert [l.id for l in pool.leases()] == kept, f"moment {i}"

    asyncio.run(main())


def test_fifo_earliest_waiter_that_fits_is_served_first(tmp_path):
    pool = make_pool(tmp_path)
    a = pool.try_acquire("alice", "", 2)
    b = pool.try_acquire("bob", "", 2)

    async def main():
        first = asyncio.ensure_future(pool.acquire("carol", "", 2, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        second = asyncio.ensure_future(pool.acquire("dave", "", 2, timeout=30))
        await until(lambda: len(pool.queue()) == 2)
        assert [w.user for w in pool.queue()] == ["carol", "dave"]
        pool.release(a.id, "stopped")
        got = await first
        assert not second.done()
        assert [w.user for w in pool.queue()] == ["dave"]
        pool.release(b.id, "stopped")
        return got, await second

    first, second = asyncio.run(main())
    assert first.user == "carol" and second.user == "dave"


def test_backfill_lets_small_requests_pass_a_big_one_only_within_the_window(tmp_path):
    pool = make_pool(tmp_path, backfill_window=3600)
    held = pool.try_acquire("alice", "", 2)

    async def scenario():
        big = asyncio.ensure_future(pool.acquire("bob", "", 4, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        # Within the window: a 1-GPU request may use a GPU the big one cannot use yet.
        small = pool.try_acquire("carol", "", 1)
        assert small is not None
        # Past the window: free GPUs are held for the big request.
        pool.backfill_window = 0
        assert pool.try_acquire("dave", "", 1) is None
        pool.release(small.id, "stopped")
        pool.release(held.id, "stopped")
        return await big

    big = asyncio.run(scenario())
    assert big.user == "bob" and len(big.gpu_uuids) == 4


def test_queue_is_shared_between_processes(tmp_path):
    # Two pool objects on one ledger stand for two hub processes: the waiter
    # of one keeps its place against the other, and is served when the other
    # releases (by polling, as across processes).
    hub1 = make_pool(tmp_path, backfill_window=0)
    hub2 = make_pool(tmp_path, backfill_window=0)
    held = hub2.try_acquire("alice", "", 3)

    async def main():
        waiter = asyncio.ensure_future(hub1.acquire("bob", "", 2, timeout=30))
        await until(lambda: len(hub2.queue()) == 1)
        assert hub2.queue()[0].user == "bob"
        assert hub2.try_acquire("carol", "", 1) is None  # the free GPU is held for bob
        hub2.release(held.id, "stopped")
        return await waiter

    assert asyncio.run(main()).user == "bob"


def test_waiters_of_dead_processes_are_ignored_and_removed(tmp_path):
    pool = make_pool(tmp_path, backfill_window=0, waiter_stale_after=5)
    pool.try_acquire("alice", "", 3)
    old = datetime.now(UTC) - timedelta(minutes=5)
    with pool._engine_ready().begin() as conn:
        conn.execute(insert(waiters_table).values(
            owner="deadhost:1", user_name="ghost", server_name="", count=1, groups="[]",
            enqueued_at=old, heartbeat_at=old))
    assert pool.queue() == []
    lease = pool.try_acquire("bob", "", 1)
    assert lease is not None
    assert queue_rows(pool) == []


def test_on_wait_may_be_async_and_sees_the_position_move(tmp_path):
    pool = make_pool(tmp_path)
    a = pool.try_acquire("alice", "", 2)
    b = pool.try_acquire("bob", "", 2)
    seen = []

    async def record(position, wanted, free):
        seen.append((position, wanted, free))

    async def main():
        first = asyncio.ensure_future(pool.acquire("carol", "", 4, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        second = asyncio.ensure_future(pool.acquire("dave", "", 4, timeout=30, on_wait=record))
        await until(lambda: seen)
        first.cancel()
        await until(lambda: len(seen) == 2)
        pool.release(a.id, "stopped")
        pool.release(b.id, "stopped")
        return await second

    assert asyncio.run(main()).user == "dave"
    assert seen == [(2, 4, 0), (1, 4, 0)]


def test_a_request_that_becomes_impossible_while_waiting_fails_clearly(tmp_path):
    pool = make_pool(tmp_path)
    held = pool.try_acquire("alice", "", 1)

    async def main():
        task = asyncio.ensure_future(pool.acquire("bob", "", 4, timeout=30))
        await until(lambda: len(pool.queue()) == 1)
        pool.drain(held.gpu_uuids[0])
        pool.release(held.id, "stopped")
        return await task

    with pytest.raises(Unsatisfiable, match="drained"):
        asyncio.run(main())
    assert queue_rows(pool) == []


def test_quota_is_checked_before_queueing(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=2)
    pool.try_acquire("alice", "", 2)
    with pytest.raises(QuotaExceeded):
        asyncio.run(pool.acquire("alice", "more", 1, timeout=30))
    assert queue_rows(pool) == []
