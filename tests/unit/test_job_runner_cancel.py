"""A job cancelled while it waits for GPUs gives its running place back (a real SQLite ledger).

Without the runner's own GPUs or Docker: the job never gets as far as a container."""

from __future__ import annotations

import asyncio

from devservices.waiting import async_until
from spawner.engines import make_job_engine
from spawner.inventory.machine import StaticInventory
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool import GPUPool
from spawner.pool.ledger.job_records import CANCELLED
from spawner.profiles import DEFAULT_PROFILES

HOST = "unit-host"


def test_a_job_cancelled_in_the_gpu_queue_frees_its_place_for_the_users_next_job(tmp_path):
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                   inventory=StaticInventory(host=HOST, gpus_list=[{"uuid": "GPU-only", "index": 0}]))
    pool.sync_inventory()
    # One running job per user, and the host's one GPU lent to someone else: the job holds
    # its place and waits in the pool's queue.
    settings = JobSettings(profiles=DEFAULT_PROFILES, host=HOST, limits={"max_running": 1})
    runner = JobRunner(pool, settings, make_job_engine(settings))
    other = pool.try_acquire("ada", "", 1)
    assert other is not None

    async def main():
        job = runner.ledger.create("pat", [], "tf-gpu-1", ["true"], "", 60, HOST, 1000, 100)
        runner._spawn(job)
        task = runner._tasks[job.id]
        # It queues for the GPU (its place held meanwhile).
        await async_until(pool.queue, timeout=30, what="the job in the GPU queue")
        cancelled = await runner.cancel(job.id)
        assert cancelled.state == CANCELLED
        assert task.done() and task.exception() is None  # cancel() waited for it; it ended cleanly
        # The user's next job needs no GPU: with the place given back it may run at once.
        return runner.limits.wait_reason(runner.profiles["tf-cpu"], runner.places.of_user("pat"))

    try:
        assert asyncio.run(main()) is None
        assert not pool.queue()
    finally:
        pool.release(other.id)
        pool.close()
