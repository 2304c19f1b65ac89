"""A running batch job meets the pool's fair-use rules as a server does (a real SQLite ledger):
its lease running past its holder's GPU-hour budget, or into a booking for someone else, stops
it, with the reason in the job's message and in the lease's end (`budget`, `booking`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from devservices.waiting import until
from spawner.engines import make_job_engine
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool.ledger.job_records import CANCELLED, QUEUED, RUNNING
from spawner.pool.models import EndReason
from spawner.profiles import DEFAULT_PROFILES

from .test_pool_fairshare import HOST, H, make_pool, past_lease, sqlite_url


def running_job(runner: JobRunner, user: str, lease_id: int):
    job = runner.ledger.create(user, [], "tf-gpu-1", ["sleep", "600"], "", 3600, HOST, 1000, 100)
    return runner.ledger.update(job.id, (QUEUED,), "started_at", state=RUNNING, lease_id=lease_id)


def test_a_job_past_its_holders_budget_is_stopped_with_the_reason(tmp_path):
    pool = make_pool(sqlite_url(tmp_path), gpus=2, gpu_hour_budget=40)
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=HOST), make_job_engine(js))
    now = datetime.now(UTC)
    try:
        over = running_job(runner, "carol", past_lease(pool, "carol", now - 41 * H, None))
        within = running_job(runner, "dave", past_lease(pool, "dave", now - 2 * H, None))
        assert asyncio.run(runner.fair_use.round()) == [over.id]  # dave is within his budget
        assert ("its GPU-hour budget is used up (You have used 41.0 of your 40 GPU-hours"
                in runner.fair_use.message(over))
        assert runner.fair_use.end_reason(over, CANCELLED) == EndReason.BUDGET
        assert runner.fair_use.end_reason(within, CANCELLED) == EndReason.JOB_CANCELLED  # only its owner's cancel
        assert runner.fair_use.message(within) == "cancelled while running"
        # Marked like a cancel: the job's own watch stops it at its next turn; a second round
        # does not mark it again.
        assert over.id in runner._cancel and within.id not in runner._cancel
        assert asyncio.run(runner.fair_use.round()) == []
    finally:
        pool.close()


def test_a_job_on_a_gpu_booked_for_someone_else_is_stopped_when_the_booking_starts(tmp_path):
    pool = make_pool(sqlite_url(tmp_path), gpus=1)
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=HOST), make_job_engine(js))
    now = datetime.now(UTC)
    try:
        lease = past_lease(pool, "erin", now - H, None)
        job = running_job(runner, "erin", lease)
        booking = pool.book("frank", 1, now + timedelta(seconds=2), now + 2 * H, host=HOST, admin=True)
        assert asyncio.run(runner.fair_use.round()) == []  # not before its window
        until(lambda: datetime.now(UTC) >= booking.starts_at, timeout=10, what="the booking's own start")
        assert asyncio.run(runner.fair_use.round()) == [job.id]
        assert "booked by someone else" in runner.fair_use.message(job)
        assert runner.fair_use.end_reason(job, CANCELLED) == EndReason.BOOKING
    finally:
        pool.close()
