"""Running batch jobs meet the pool's fair-use rules as servers do, on a real ledger (SQLite here;
PostgreSQL in tests/integration/test_pool_fairshare_postgres.py): the pool-side check, given a
runner's jobs, names each running job whose lease runs past its holder's GPU-hour budget, or
into a booking for someone else, and why; the runner stops those, with the reason in the job's
message and in its leases' end (`budget`, `booking`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from devservices.waiting import until
from spawner.engines import make_job_engine
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool.fair_use.stops import FairUseStop, fair_use_stops
from spawner.pool.ledger.job_records import CANCELLED, QUEUED, RUNNING, JobLedger
from spawner.pool.models import EndReason
from spawner.profiles import DEFAULT_PROFILES

from .test_pool_fairshare import HOST, H, make_pool, past_lease, sqlite_url


def running_job(ledger: JobLedger, user: str, lease_id: int):
    job = ledger.create(user, [], "tf-gpu-1", ["sleep", "600"], "", 3600, HOST, 1000, 100)
    return ledger.update(job.id, (QUEUED,), "started_at", state=RUNNING, lease_id=lease_id)


def budget_stops_only_the_job_past_it(url: str) -> None:
    pool = make_pool(url, gpus=3, gpu_hour_budget=40)
    ledger = JobLedger(pool)
    now = datetime.now(UTC)
    try:
        over = running_job(ledger, "carol", past_lease(pool, "carol", now - 41 * H, None))
        within = running_job(ledger, "dave", past_lease(pool, "dave", now - 2 * H, None))
        # Queued, on a lease far past its holder's budget: only running jobs are stopped.
        queued = ledger.update(ledger.create("ed", [], "tf-gpu-1", ["true"], "", 60, HOST, 1000, 100).id,
                               (QUEUED,), lease_id=past_lease(pool, "ed", now - 50 * H, None))
        stops = fair_use_stops(pool, [over, within, queued])
        assert [(s.job_id, s.reason) for s in stops] == [(over.id, EndReason.BUDGET)]
        assert stops[0].message.startswith("stopped: its GPU-hour budget is used up (You have used 41.0 of your "
                                           "40 GPU-hours")
        assert fair_use_stops(pool, []) == []
    finally:
        pool.close()


def booking_stops_the_job_once_it_begins(url: str) -> None:
    pool = make_pool(url, gpus=1)
    ledger = JobLedger(pool)
    now = datetime.now(UTC)
    try:
        job = running_job(ledger, "erin", past_lease(pool, "erin", now - H, None))
        booking = pool.book("frank", 1, now + timedelta(seconds=2), now + 2 * H, host=HOST, admin=True)
        assert fair_use_stops(pool, [job]) == []  # not before its window
        until(lambda: datetime.now(UTC) >= booking.starts_at, timeout=10, what="the booking's own start")
        assert fair_use_stops(pool, [job]) == [FairUseStop(
            job.id, f"stopped: its GPU is booked by someone else from {booking.starts_at.strftime('%H:%M')} UTC "
                    f"(booking {booking.id})", EndReason.BOOKING)]
    finally:
        pool.close()


def test_the_pools_check_stops_a_running_job_past_its_holders_budget(tmp_path):
    budget_stops_only_the_job_past_it(sqlite_url(tmp_path))


def test_the_pools_check_stops_a_job_on_a_gpu_booked_for_someone_else_once_the_booking_starts(tmp_path):
    booking_stops_the_job_once_it_begins(sqlite_url(tmp_path))


def test_the_runner_stops_what_the_pools_check_names_with_its_reason(tmp_path):
    pool = make_pool(sqlite_url(tmp_path), gpus=2, gpu_hour_budget=40)
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=HOST), make_job_engine(js))
    now = datetime.now(UTC)
    try:
        over = running_job(runner.ledger, "carol", past_lease(pool, "carol", now - 41 * H, None))
        within = running_job(runner.ledger, "dave", past_lease(pool, "dave", now - 2 * H, None))
        assert asyncio.run(runner.stop_for_fair_use()) == [over.id]  # dave is within his budget
        assert "its GPU-hour budget is used up (You have used 41.0 of your 40 GPU-hours" in \
            runner.stops.message(over.id)
        assert runner.stops.end_reason(over.id, CANCELLED) == EndReason.BUDGET
        assert runner.stops.end_reason(within.id, CANCELLED) == EndReason.JOB_CANCELLED  # only its owner's cancel
        assert runner.stops.message(within.id) == "cancelled while running"
        # Marked like a cancel: the job's own watch stops it at its next turn; a second round
        # does not mark it again, and its owner's cancel meanwhile keeps the first reason.
        assert over.id in runner.stops and within.id not in runner.stops
        assert asyncio.run(runner.stop_for_fair_use()) == []
        runner.stops.ask(over.id)
        assert runner.stops.end_reason(over.id, CANCELLED) == EndReason.BUDGET
    finally:
        pool.close()
