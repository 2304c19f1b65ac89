"""Every job is a group of units driven the same way: a plain job (one unit) and a cluster (one
unit per worker, on a network of its own) go through the very same steps of the runner (a real
SQLite ledger and runner; an engine of in-memory units in place of Docker, whose real runs are
tests/integration/test_jobs.py and test_job_clusters.py)."""

from __future__ import annotations

import asyncio

import pytest

from devservices.waiting import async_until
from spawner.inventory import SimulatedInventory
from spawner.jobs import group as group_module
from spawner.jobs import runner as runner_module
from spawner.jobs.engine import ENDED, UnitState
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool import GPUPool
from spawner.pool.ledger.job_records import CANCELLED, SUCCEEDED
from spawner.profiles import DEFAULT_PROFILES
from tests.fixtures.job_units import MemoryUnits

HOST = "unit-host"


class Units(MemoryUnits):
    """Units that print one line and exit with `code` as soon as they are made."""

    def __init__(self, code: int = 0, ends: bool = True):
        super().__init__(HOST)
        self.code, self.ends = code, ends
        self.made: list[tuple[str, tuple[str, ...], str | None]] = []  # (name, gpus, network)

    async def create(self, spec):
        self.made.append((spec.name, spec.gpus, spec.network))
        self.units[spec.name] = {"ended": self.ends, "log": f"done on {','.join(spec.gpus)}\n".encode()}

    def unit_state(self, name, unit):
        return UnitState(name, name, phase=ENDED if unit["ended"] else "running",
                         exit_code=self.code if unit["ended"] else None)

    async def stop(self, name, grace):
        if name in self.units:
            self.units[name]["ended"] = True
        return True


def run_job(tmp_path, monkeypatch, workers: int, engine: Units, cancel: bool = False):
    """Run one job of `workers` units of the 1-GPU profile to its end; (the job, the pool's leases
    of it, the group sizes the runner drove)."""
    pool = GPUPool(db_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}", inventory=SimulatedInventory(count=4, host=HOST))
    pool.sync_inventory()
    runner = JobRunner(pool, JobSettings(profiles=DEFAULT_PROFILES, host=HOST, prefix="t"), engine=engine)
    made: list[int] = []  # the size of every group the runner made, whatever it did with it

    def recording_group_of(job, settings, engine):
        group = group_module.group_of(job, settings, engine)
        made.append(group.size)
        return group

    monkeypatch.setattr(runner_module, "group_of", recording_group_of)

    async def main():
        job = runner.ledger.create("pat", [], "tf-gpu-1", ["python", "train.py"], "", 600, HOST, 1000, 100,
                                   workers=workers)
        runner._spawn(job)
        if cancel:
            await async_until(lambda: (j := runner.ledger.get(job.id)).container and j, 10, "the job running")
            return await runner.cancel(job.id)
        return await async_until(lambda: (j := runner.ledger.get(job.id)).ended_at and j, 10, "the job's end")

    try:
        ended = asyncio.run(main())
        leases = [pool.lease(lease_id) for lease_id in ended.lease_ids]
        return ended, leases, runner.ledger.log(ended.id), made
    finally:
        pool.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_plain_job_and_a_cluster_go_through_the_same_group_steps(tmp_path, monkeypatch, workers):
    engine = Units(code=0)
    job, leases, kept, made = run_job(tmp_path, monkeypatch, workers, engine)
    assert job.state == SUCCEEDED and job.exit_code == 0 and job.message is None
    # Every step made the job's group, of its size: one unit, or one per worker.
    assert made and set(made) == {workers}
    # Each unit on its own leased GPU; all removed; every lease ended once they were.
    assert len(engine.made) == workers and not engine.units
    assert len({gpus for _, gpus, _ in engine.made}) == workers and all(len(g) == 1 for _, g, _ in engine.made)
    assert len(leases) == workers and all(not lease.active and lease.end_reason == "job-finished" for lease in leases)
    if workers == 1:  # its one container, its log as it printed it, no network of its own
        assert [name for name, _, _ in engine.made] == [f"t-job-{job.id}"] and engine.made[0][2] is None
        assert kept == f"done on {job.gpu_uuids[0]}\n" and not engine.networks_removed
    else:  # its workers on a network of their own, made and removed with them; each line marked
        assert [name for name, _, _ in engine.made] == [f"t-job-{job.id}-w0", f"t-job-{job.id}-w1"]
        assert {net for _, _, net in engine.made} == {f"t-job-{job.id}-net"}
        assert engine.networks_removed == [f"t-job-{job.id}-net"] and not engine.network_jobs
        assert kept == "".join(f"[worker {u['worker']}] done on {u['gpus'][0]}\n" for u in job.units)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_unit_that_fails_ends_the_group_failed_naming_it(tmp_path, monkeypatch, workers):
    job, leases, _, _ = run_job(tmp_path, monkeypatch, workers, Units(code=3))
    assert job.state == "failed" and job.exit_code == 3
    assert job.message == ("exited with code 3" if workers == 1 else "worker 0 exited with code 3")
    assert all(lease.end_reason == "job-failed" for lease in leases)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cancel_stops_every_unit_of_the_group(tmp_path, monkeypatch, workers):
    engine = Units(ends=False)
    job, leases, _, _ = run_job(tmp_path, monkeypatch, workers, engine, cancel=True)
    assert job.state == CANCELLED and job.message == "cancelled while running"
    assert not engine.units and all(lease.end_reason == "job-cancelled" for lease in leases)
