"""The ledger's own failures inside a wait: a hub whose clock is off, a ledger locked for a moment."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta

import pytest

from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool, PoolUnavailable
from tests.unit.test_pool_queue import until

HOST = "node-1"


def make_pool(url, **kwargs) -> GPUPool:
    kwargs.setdefault("poll_interval", 0.05)
    return GPUPool(inventory=SimulatedInventory(count=1, host=HOST), db_url=url, **kwargs)


def skew(pool: GPUPool, seconds: float) -> None:
    """Set this pool's machine clock off by `seconds` (the lowest layer that reads it)."""
    pool._store.clock = lambda: datetime.now(UTC) + timedelta(seconds=seconds)


def test_a_hub_whose_clock_is_behind_keeps_its_place_in_the_queue(tmp_path):
    slow_clock_keeps_its_place(f"sqlite:///{tmp_path / 'ledger.sqlite'}")


def slow_clock_keeps_its_place(url: str) -> None:
    """Two hubs share one queue; one's clock is 30 s behind: its waiter is not taken for dead."""
    slow = make_pool(url, waiter_stale_after=3)  # a second hub whose clock is 30 s behind
    hub = make_pool(url, waiter_stale_after=3)
    skew(slow, -30)
    holder = hub.try_acquire("holder", "", 1)

    async def main():
        alice = asyncio.create_task(slow.acquire("alice", "", 1, timeout=20))
        await until(lambda: [w.user for w in hub.queue()] == ["alice"])
        bob = asyncio.create_task(hub.acquire("bob", "", 1, timeout=20))
        await until(lambda: len(hub.queue()) == 2)
        await asyncio.sleep(0.5)  # both hubs poll the queue several times
        assert [w.user for w in hub.queue()] == ["alice", "bob"]
        hub.release(holder.id)
        lease = await alice
        assert lease.user == "alice"  # first come, first served across hubs
        bob.cancel()

    try:
        asyncio.run(main())
    finally:
        slow.close()
        hub.close()


def hold_write_lock(path, seconds: float) -> None:
    """Another process's writer holding the SQLite ledger's lock, as a stuck transaction would."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)  # the lock is held this long: the waiters must outlast it
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()


def test_a_ledger_locked_for_a_moment_does_not_fail_the_waiters(tmp_path):
    path = tmp_path / "ledger.sqlite"
    pool = make_pool(f"sqlite:///{path}", lock_timeout=0.2)
    holder = pool.try_acquire("holder", "", 1)

    async def main():
        # One after the other, each seen in the queue before the next asks: two requests made at
        # once take the ledger's lock in either order (its threads race), and bob could be first.
        waiters = []
        for u in ("alice", "bob"):
            waiters.append(asyncio.create_task(pool.acquire(u, "", 1, timeout=30)))
            await until(lambda: len(pool.queue()) == len(waiters))
        assert [w.user for w in pool.queue()] == ["alice", "bob"]
        # Locked for 1 s: every turn of both waiters in that time fails to get the lock.
        await asyncio.to_thread(hold_write_lock, path, 1.0)
        assert not any(w.done() for w in waiters)
        pool.release(holder.id)
        first = await waiters[0]
        assert first.user == "alice"
        pool.release(first.id)
        assert (await waiters[1]).user == "bob"

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_ledger_that_stays_locked_fails_the_wait_at_its_timeout(tmp_path):
    path = tmp_path / "ledger.sqlite"
    pool = make_pool(f"sqlite:///{path}", lock_timeout=0.2)
    pool.try_acquire("holder", "", 1)

    async def main():
        waiter = asyncio.create_task(pool.acquire("alice", "", 1, timeout=1.5))
        await until(lambda: len(pool.queue()) == 1)
        blocker = asyncio.create_task(asyncio.to_thread(hold_write_lock, path, 3.0))
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(PoolUnavailable, match="locked"):
            await waiter
        assert loop.time() - start < 2.5  # its own timeout, not the lock's length
        await blocker

    try:
        asyncio.run(main())
    finally:
        pool.close()
