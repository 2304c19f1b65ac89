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
    joined = pool.grant_or_queue(pool.request_for("carol", "", 1))
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


def test_a_wait_driven_step_by_step_through_the_pools_public_calls(tmp_path):
    """What acquire's wait and its watch call, driven by a caller with its own clock (the replay
    bench does this): join the queue, read it, beat, take the grant when the read says so, or
    leave.  No event loop and no real waiting."""
    clock = FakeClock()
    pool = make_pool(tmp_path, clock, 2, waiter_stale_after=600, queue_order="fifo", backfill_window=0)
    holder = pool.try_acquire("holder", "", 1)
    assert holder is not None
    big = pool.request_for("alice", "", 2, holds_for=3600)
    joined = pool.grant_or_queue(big)  # one GPU is free: alice queues
    assert joined.leases == () and joined.waiter_id is not None and joined.position == 1
    small = pool.request_for("bob", "", 1)
    behind = pool.grant_or_queue(small)  # FIFO, no backfill: the free GPU is held for alice
    assert behind.leases == () and behind.position == 2
    views = pool.read_queue({joined.waiter_id: big, behind.waiter_id: small})
    assert views is not None and not views[joined.waiter_id].ask and not views[behind.waiter_id].ask
    clock.advance(500)
    pool.heartbeat([joined.waiter_id])  # alice's process is alive, bob's is not
    clock.advance(200)  # bob's row is now 700 s without a heartbeat (stale after 600)
    assert [w.user for w in pool.queue()] == ["alice"]
    pool.release(holder.id)
    views = pool.read_queue({joined.waiter_id: big})
    assert views is not None and views[joined.waiter_id].ask  # a grant would serve alice now
    granted = pool.grant_or_queue(big, joined.waiter_id)
    assert [len(lease.gpu_uuids) for lease in granted.leases] == [2] and pool.queue() == []
    # A wait's last try (queue=False) leaves no row; leave_queue removes one that stayed.
    last = pool.grant_or_queue(pool.request_for("carol", "", 1), queue=False)
    assert last.leases == () and last.waiter_id is None and pool.queue() == []
    dave = pool.grant_or_queue(pool.request_for("dave", "", 1))
    assert dave.waiter_id is not None and [w.user for w in pool.queue()] == ["dave"]
    pool.leave_queue(dave.waiter_id)
    assert pool.queue() == []
    pool.close()
