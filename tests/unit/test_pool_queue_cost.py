"""What waiting in the queue costs the ledger (SQLite): read-only polls, one heartbeat write for
all of a process's waiters, and no thread of the loop's default executor.

Counts, never times: the time the spawn path takes with 500 waiters is in bench/bench_queue.py.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from spawner.pool import waiters_table

from .test_pool_queue import make_pool, until

WAITERS = 20


class Counting:
    """Counts the pool's transactions, by kind."""

    def __init__(self, pool):
        self.reads = self.writes = 0
        store = pool._store
        inner = store.transact

        def transact(engine, fn, *args, write, **kwargs):
            if write:
                self.writes += 1
            else:
                self.reads += 1
            return inner(engine, fn, *args, write=write, **kwargs)

        store.transact = transact

    def reset(self):
        self.reads = self.writes = 0


def heartbeats(pool) -> list:
    with pool._engine_ready().connect() as conn:
        return [row.heartbeat_at for row in conn.execute(select(waiters_table))]


async def queue_up(pool, n: int) -> list[asyncio.Future]:
    tasks = [asyncio.ensure_future(pool.acquire(f"u{i}", "", 1, timeout=60)) for i in range(n)]
    await until(lambda: len(pool.queue()) == n)
    return tasks


async def cancel(tasks) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_waiters_poll_the_ledger_without_writing(tmp_path):
    # Heartbeats far apart: between them, waiting must not write at all.
    pool = make_pool(tmp_path, poll_interval=0.02, heartbeat_interval=60, waiter_stale_after=600)
    pool.try_acquire("alice", "", 4)
    counts = Counting(pool)

    async def main():
        tasks = await queue_up(pool, WAITERS)
        counts.reset()
        await until(lambda: counts.reads + counts.writes >= 40)
        seen = (counts.reads, counts.writes)
        await cancel(tasks)
        return seen

    reads, writes = asyncio.run(main())
    assert writes == 0, f"{writes} write transactions (and {reads} reads) while {WAITERS} requests waited"
    assert pool.queue() == []


def test_one_heartbeat_write_refreshes_every_waiter_of_the_process(tmp_path):
    # Polls far apart (nothing is released): what writes is the heartbeat, once for all.
    pool = make_pool(tmp_path, poll_interval=600, heartbeat_interval=0.05, waiter_stale_after=600)
    pool.try_acquire("alice", "", 4)
    counts = Counting(pool)

    async def main():
        tasks = await queue_up(pool, WAITERS)
        counts.reset()
        first = heartbeats(pool)
        await until(lambda: counts.writes >= 3)
        beats, writes = heartbeats(pool), counts.writes
        await cancel(tasks)
        return first, beats, writes

    first, beats, writes = asyncio.run(main())
    assert len(beats) == WAITERS and all(b > a for a, b in zip(sorted(first), sorted(beats)))
    assert len(set(beats)) == 1, "the waiters' rows were refreshed one transaction each"
    assert writes < WAITERS


class Refusing(ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it."""

    used = 0

    def submit(self, fn, /, *args, **kwargs):
        Refusing.used += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("served", [True, False], ids=["served", "cancelled"])
def test_waiting_runs_on_the_ledgers_own_threads(tmp_path, served):
    pool = make_pool(tmp_path)
    held = pool.try_acquire("alice", "", 4)
    Refusing.used = 0

    async def main():
        asyncio.get_running_loop().set_default_executor(Refusing(max_workers=2))
        tasks = await queue_up(pool, 3)
        if served:
            pool.release(held.id, "stopped")
            await asyncio.gather(*tasks)
        else:
            await cancel(tasks)

    asyncio.run(main())
    assert Refusing.used == 0, "ledger calls of the queue ran on the loop's default executor"
