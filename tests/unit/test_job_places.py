"""A job cancelled while it waits for GPUs gives its running place back (the runner's own
bookkeeping of JobLimits), on a real SQLite ledger; no engine is reached."""

from __future__ import annotations

import asyncio
import contextlib

from devservices.waiting import async_until
from spawner.engines import make_job_engine
from spawner.inventory import SimulatedInventory
from spawner.jobs.request import Submission
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool import GPUPool
from spawner.pool.ledger.job_records import CANCELLED, QUEUED
from spawner.profiles import DEFAULT_PROFILES


def test_a_job_cancelled_in_the_gpu_queue_leaves_room_for_the_next(tmp_path):
    host = "places-host"
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=1, host=host))
    pool.sync_inventory()
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=host, limits={"max_running": 1}),
                       make_job_engine(js))
    profile = runner.profiles["tf-gpu-1"]
    sub = Submission(profile=profile, command=("true",), workdir="", timeout_s=60)

    async def position_is(job, wanted):
        return wanted(await runner.position(job))

    async def scenario():
        pool.try_acquire("ann", "", 1)  # a server holds the only GPU: jobs wait in the pool's queue
        first = await runner.submit("pat", [], None, sub)
        await async_until(lambda: position_is(first, lambda place: place is not None), timeout=30)
        cancelled = await runner.cancel(first.id)
        second = await runner.submit("pat", [], None, sub)
        # With the place kept by the cancelled job it would wait for `max_running`, not for a GPU.
        with contextlib.suppress(AssertionError):  # where it stands is asserted below, with its state
            await async_until(lambda: position_is(second, lambda place: place == 1), timeout=10)
        waiting = await runner.call(runner.ledger.get, second.id)
        where = await runner.position(second)
        await runner.cancel(second.id)
        return cancelled, waiting, where

    try:
        cancelled, waiting, where = asyncio.run(scenario())
    finally:
        pool.close()
    assert cancelled.state == CANCELLED
    assert waiting.state == QUEUED and where == 1 and not waiting.message, waiting
