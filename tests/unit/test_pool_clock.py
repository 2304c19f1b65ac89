"""GPUPool.clock: a pool on a virtual clock decides by that clock, with no real waiting.

Each test's windows are an hour or more of the fake clock: on the machine's clock they would
not pass while the test runs, so a pass shows the pool read the injected clock.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from devservices.waiting import async_until
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool

HOST = "node-1"


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def make_pool(tmp_path, clock: FakeClock, gpus: int, **kwargs) -> GPUPool:
    pool = GPUPool(inventory=SimulatedInventory(count=gpus, host=HOST), db_url=f"sqlite:///{tmp_path / 'l.sqlite'}",
                   poll_interval=0.05, clock=clock, **kwargs)
    pool.sync_inventory()
    return pool


def test_leases_are_timed_by_the_pools_clock(tmp_path):
    clock = FakeClock()
    pool = make_pool(tmp_path, clock, 1)
    lease = pool.try_acquire("alice", "", 1)
    assert lease is not None and lease.started_at == clock.now
    clock.advance(2 * 3600)
    pool.release(lease.id)
    (ended,) = [x for x in pool.history() if x.id == lease.id]
    assert ended.ended_at - ended.started_at == timedelta(hours=2)
    pool.close()


def test_a_dead_processs_waiter_goes_stale_when_the_clock_moves(tmp_path):
    """A queue row whose process died (no more heartbeats) is passed after 2 h of the fake clock."""
    clock = FakeClock()
    pool = make_pool(tmp_path, clock, 1, waiter_stale_after=7200)
    holder = pool.try_acquire("holder", "", 1)
    assert holder is not None
    # Carol joins the queue the way acquire() does (its first write), then her process dies.
    joined = pool._write(pool._attempt, pool._make_request("carol", "", 1, (), None), None, True)
    assert joined.waiter_id is not None and [w.user for w in pool.queue()] == ["carol"]
    pool.release(holder.id)
    assert pool.try_acquire("bob", "", 1) is None  # carol's turn: her row is alive
    clock.advance(7201)
    assert pool.queue() == []  # no longer counted as waiting
    lease = pool.try_acquire("bob", "", 1)
    assert lease is not None and lease.user == "bob"  # passed the stale row
    pool.close()


def test_the_backfill_window_passes_on_the_pools_clock(tmp_path):
    """A 2-GPU waiter lets 1-GPU requests pass for its hour-long window, then holds free GPUs."""
    clock = FakeClock()
    pool = make_pool(tmp_path, clock, 2, backfill_window=3600, waiter_stale_after=10**6, queue_order="fifo")
    holder = pool.try_acquire("holder", "", 1)
    assert holder is not None

    async def main():
        big = asyncio.create_task(pool.acquire("alice", "", 2, timeout=600))
        await async_until(lambda: [w.user for w in pool.queue()] == ["alice"])
        clock.advance(1800)  # inside the window: a small request passes
        bob = pool.try_acquire("bob", "", 1)
        assert bob is not None
        pool.release(bob.id)
        clock.advance(1801)  # the window has passed: the free GPU is held for alice
        assert pool.try_acquire("carol", "", 1) is None
        pool.release(holder.id)
        lease = await big
        assert lease.user == "alice" and len(lease.gpu_uuids) == 2

    asyncio.run(main())
    pool.close()
