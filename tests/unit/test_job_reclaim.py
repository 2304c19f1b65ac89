"""The jobs runner gives borrowed GPUs back (a real SQLite ledger and runner; an engine of
in-memory units in place of Docker, whose real run is tests/integration/test_jobs_borrow.py):
told first (SIGTERM), then stopped, its lease ended `reclaimed` only once its unit is stopped,
queued again with its attempt count, and run again once GPUs free."""

from __future__ import annotations

import asyncio

from devservices.waiting import async_until
from spawner.inventory import SimulatedInventory
from spawner.jobs.engine import ENDED, RUNNING, UnitState
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool import GPUPool
from spawner.pool.ledger.job_records import CANCELLED, QUEUED
from spawner.profiles import DEFAULT_PROFILES
from tests.fixtures.job_units import MemoryUnits

HOST = "unit-host"
THREE = {"slug": "tf-gpu-3", "display_name": "3 GPUs", "gpus": 3, "image": "img"}


class Units(MemoryUnits):
    """Units that run until stopped; `heeds`: a SIGTERM ends them (exit 0), as a trap would."""

    poll_seconds = 0.05

    def __init__(self, heeds: bool):
        super().__init__(HOST)
        self.heeds = heeds
        self.signals: list[tuple[str, str]] = []
        self.events: list[str] = []

    async def create(self, spec):
        self.units[spec.name] = {"phase": RUNNING, "log": b"training\n", "gpus": spec.gpus}

    def unit_state(self, name, unit):
        return UnitState(name, name, phase=unit["phase"], exit_code=0 if unit["phase"] == ENDED else None)

    async def signal(self, name, signal="SIGTERM"):
        self.signals.append((name, signal))
        self.events.append(f"signal {signal}")
        unit = self.units.get(name)
        if unit is not None and self.heeds:
            unit["log"] += b"notice heeded: checkpoint saved\n"
            unit["phase"] = ENDED
        return unit is not None

    async def stop(self, name, grace):
        self.events.append("stop")
        if name in self.units:
            self.units[name]["phase"] = ENDED
        return True


def run(tmp_path, heeds: bool, requeue: bool = True):
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=4, host=HOST),
                   max_gpus_per_user=1, group_gpu_limits={"ml": 2}, reclaim_grace=1.0)
    pool.sync_inventory()
    engine = Units(heeds)
    runner = JobRunner(pool, JobSettings(profiles=[*DEFAULT_PROFILES, THREE], host=HOST), engine=engine)

    async def main():
        watch = asyncio.ensure_future(runner.reclaims.forever(every=0.1))
        try:
            job = runner.ledger.create("alice", [], "tf-gpu-3", ["python", "train.py"], "", 600, HOST, 1000, 100,
                                       borrow=True, requeue=requeue)
            runner._spawn(job)
            first = await async_until(lambda: (j := runner.ledger.get(job.id)).container and j, 30, "the job running")
            lease = pool.lease(first.lease_id)
            assert lease.borrowed and len(lease.gpu_uuids) == 3
            bob = asyncio.ensure_future(pool.acquire("bob", "", 2, groups=["ml"], timeout=30))
            got = await asyncio.wait_for(bob, 20)
            assert not got.borrowed and set(got.gpu_uuids) & set(lease.gpu_uuids)
            ended = pool.lease(lease.id)
            assert ended.end_reason == "reclaimed"
            # The runner records the job's next state just after the lease ends (the end is what
            # lets bob's request through): wait for it.  Read at once, a loaded machine saw the job
            # still running (this test failed once in a unit tier run beside a full suite).
            after = await async_until(lambda: (j := runner.ledger.get(job.id)).state in (QUEUED, CANCELLED) and j,
                                      10, "the reclaimed job recorded as queued again or cancelled")
            if requeue:
                assert after.state == QUEUED and after.attempts == 2 and after.lease_id is None
                if heeds:  # its own last words are kept
                    assert "notice heeded" in (runner.ledger.log(job.id) or "")
                pool.release(got.id)  # bob stops: the job borrows again and runs
                rerun = await async_until(lambda: (j := runner.ledger.get(job.id)).container and j, 30,
                                          "the job running again")
                assert rerun.attempts == 2 and pool.lease(rerun.lease_id).borrowed
                await runner.cancel(job.id)
            else:
                assert after.state == CANCELLED and "not queued again" in after.message
            return engine.events
        finally:
            watch.cancel()
            for task in list(runner._tasks.values()):
                task.cancel()
            await asyncio.gather(watch, *runner._tasks.values(), return_exceptions=True)

    try:
        return asyncio.run(main())
    finally:
        pool.close()


def test_a_job_that_heeds_the_notice_is_told_first_and_queued_again_and_runs_again(tmp_path):
    events = run(tmp_path, heeds=True)
    assert events[0] == "signal SIGTERM" and "stop" in events[1:]


def test_a_job_that_ignores_the_notice_is_stopped_after_the_grace(tmp_path):
    events = run(tmp_path, heeds=False)
    assert events[:2] == ["signal SIGTERM", "stop"]


def test_a_job_without_requeue_ends_cancelled_when_reclaimed(tmp_path):
    run(tmp_path, heeds=True, requeue=False)


def test_every_attempt_of_a_job_and_each_of_its_workers_gets_one_checkpoint_directory_in_the_home():
    from spawner.jobs.cluster import units_of
    from spawner.jobs.spec import unit_spec

    from .test_job_clusters import worker_specs
    from .test_jobs import PROFILES, _job

    settings = JobSettings(prefix="gpuhub", host="node1", home_mount_point="/home/jovyan")
    profile = next(p for p in PROFILES if p.slug == "tf-gpu-1")
    first = unit_spec(_job(attempts=1), profile, settings, "gpuhub-home-pat", "l")
    again = unit_spec(_job(attempts=2, lease_id=9, gpu_uuids=("GPU-b",)), profile, settings, "gpuhub-home-pat", "l")
    other = unit_spec(_job(id=13), profile, settings, "gpuhub-home-pat", "l")
    assert first.env["GPUHUB_CHECKPOINT_DIR"] == again.env["GPUHUB_CHECKPOINT_DIR"] == \
        "/home/jovyan/.gpuhub/checkpoints/job-12"
    assert other.env["GPUHUB_CHECKPOINT_DIR"] == "/home/jovyan/.gpuhub/checkpoints/job-13"
    # The container makes it (as the job's user, in the home it mounts) before the command runs.
    assert 'mkdir -p -- "$GPUHUB_CHECKPOINT_DIR"' in first.command[2]
    workers = worker_specs(_job(workers=2, units=tuple(units_of([], 2, "node1"))), profile, settings,
                           "gpuhub-home-pat", "l")
    assert {w.env["GPUHUB_CHECKPOINT_DIR"] for w in workers} == {"/home/jovyan/.gpuhub/checkpoints/job-12"}
