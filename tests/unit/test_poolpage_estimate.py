"""Wait estimates played forward over what is known: job timeouts and bookings (estimate.py, wait.py)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import pytest

from spawner.pool.fair_use.bookings import Booking
from spawner.pool.ledger.job_records import Job
from spawner.pool.models import Lease
from spawner.poolpage import estimate
from spawner.poolpage.handlers.wait import known_ends

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
LENGTHS = [4 * 3600.0]  # past leases ran 4 h: a lease of typical length ends at its start + 4 h


def booking(user: str, uuid: str, starts: datetime, ends: datetime, group: str | None = None) -> Booking:
    return Booking(1, user, group, "node", (uuid,), starts, ends, user)


def job(job_id: int, started: datetime, timeout_s: int, state: str = "running") -> Job:
    return Job(job_id, "ann", (), "p", ("python",), "/home/ann", timeout_s, "node", 1000, 100, state, 7, None,
               ("g0",), None, None, started, started, None)


def test_a_running_jobs_lease_is_back_at_its_start_plus_its_timeout():
    lease = Lease(7, "ann", "job/3", "node", ("g0",), (), NOW - 10 * M, None)
    ends = known_ends(lease, {3: job(3, NOW - 10 * M, 1800)}, [], NOW, "ann's")
    assert ends == ((NOW + 20 * M, "ann's job reaches its timeout at 12:20 UTC"),)
    holding = estimate.Holding(lease.started_at, 1, ends=ends, slots=(("node", "g0"),))
    # Sooner than the typical 4 h lease: the timeout is what the waiter is told.
    assert estimate.waits_explained([1], 0, [holding], NOW, LENGTHS) == [
        (1200.0, "ann's job reaches its timeout at 12:20 UTC")]
    # The culler stops servers, not jobs: a booking of its GPU does not end it.
    later = booking("bob", "g0", NOW + 5 * M, NOW + H)
    assert known_ends(lease, {3: job(3, NOW - 10 * M, 1800)}, [later], NOW, "ann's") == ends
    # A notebook server of the same age has no timeout: the typical length holds.
    server = Lease(8, "ann", "", "node", ("g0",), (), NOW - 10 * M, None)
    assert known_ends(server, {3: job(3, NOW - 10 * M, 1800)}, [], NOW, "ann's") == ()
    assert estimate.waits_explained([1], 0, [estimate.Holding(server.started_at, 1)], NOW, LENGTHS) == [
        (4 * 3600.0 - 600.0, "a lease of typical length ends")]


def test_a_gpu_booked_by_someone_else_is_free_for_a_waiter_only_when_the_booking_ends():
    # g0 is free now but booked by bob from now to 14:00; g1 is lent (typical end 13:00).
    bob = booking("bob", "g0", NOW - 5 * M, NOW + 2 * H)
    lent = estimate.Holding(NOW - 3 * H, 1, slots=(("node", "g1"),))
    got = estimate.waits_explained([1, 1], 1, [lent], NOW, LENGTHS, bookings=[bob],
                                   who=[("cy", ()), ("dee", ())], free_slots=[("node", "g0")])
    assert got == [(3600.0, "a lease of typical length ends"),
                   (7200.0, "a booking of a GPU ends at 14:00 UTC")]
    # bob himself (or his group's members) is served from it at once.
    assert estimate.waits_explained([1], 1, [lent], NOW, LENGTHS, bookings=[bob], who=[("bob", ())],
                                    free_slots=[("node", "g0")]) == [(0.0, "GPUs are free now")]
    course = booking("ada", "g0", NOW - 5 * M, NOW + 2 * H, group="course")
    assert estimate.waits_explained([1], 1, [], NOW, LENGTHS, bookings=[course], who=[("eve", ("course",))],
                                    free_slots=[("node", "g0")]) == [(0.0, "GPUs are free now")]


def test_a_lease_on_a_gpu_booked_later_ends_at_the_bookings_start():
    # ann holds g0 since 11:00; bob booked it 12:30-13:30: ann's server is stopped at 12:30.
    lease = Lease(9, "ann", "", "node", ("g0",), (), NOW - H, None)
    bob = booking("bob", "g0", NOW + 30 * M, NOW + 90 * M)
    ends = known_ends(lease, {}, [bob], NOW, "a")
    assert ends == ((NOW + 30 * M, "a server is stopped at 12:30 UTC for a booking"),)
    holding = estimate.Holding(lease.started_at, 1, ends=ends, slots=(("node", "g0"),))
    # bob, waiting, gets it when the booking starts; cy only when it ends.
    assert estimate.waits_explained([1], 0, [holding], NOW, LENGTHS, bookings=[bob], who=[("bob", ())]) == [
        (1800.0, "a server is stopped at 12:30 UTC for a booking")]
    assert estimate.waits_explained([1], 0, [holding], NOW, LENGTHS, bookings=[bob], who=[("cy", ())]) == [
        (5400.0, "a booking of a GPU ends at 13:30 UTC")]
    # cy waits first, bob behind her: the queue lets bob pass (the GPU is not cy's in the window).
    assert estimate.waits_explained([1, 1], 0, [holding], NOW, LENGTHS, bookings=[bob],
                                    who=[("cy", ()), ("bob", ())]) == [
        (5400.0, "a booking of a GPU ends at 13:30 UTC"), (1800.0, "a server is stopped at 12:30 UTC for a booking")]
    # The booker's own lease is not cut by the booking.
    assert known_ends(Lease(9, "bob", "", "node", ("g0",), (), NOW - H, None), {}, [bob], NOW, "a") == ()


def test_a_gpu_coming_back_inside_someone_elses_booking_waits_for_its_end():
    # g1 is back at 13:00 (its typical end), but bob booked it 12:45-15:00: for cy it is free at 15:00.
    lent = estimate.Holding(NOW - 3 * H, 1, slots=(("node", "g1"),))
    b = booking("bob", "g1", NOW + 45 * M, NOW + 3 * H)
    assert estimate.waits_explained([1], 0, [lent], NOW, LENGTHS, bookings=[b], who=[("cy", ())]) == [
        (3 * 3600.0, "a booking of a GPU ends at 15:00 UTC")]
    # Without bookings, the old count model: the same answer as before.
    assert estimate.waits([1], 0, [lent], NOW, LENGTHS) == [3600.0]


def test_api_wait_tells_each_waiter_the_known_end_it_waits_for(tmp_path):
    """The pool service's api/wait (the hub's login and server list stood in for): cy and dee
    wait for the GPUs of dan's job (20 min timeout) and of ann's server on a GPU bob booked from
    in 30 min; each is told what ends her wait: the job's timeout, then bob's booking (not
    ann's stop)."""
    import requests

    from spawner.inventory import SimulatedInventory
    from spawner.pool import GPUPool
    from spawner.pool.ledger.job_records import RUNNING, JobLedger, job_server_name
    from spawner.services.hub_api import Server

    pool = GPUPool(inventory=SimulatedInventory(count=2, host="node"), db_url=f"sqlite:///{tmp_path}/l.sqlite")
    pool.sync_inventory()
    now = datetime.now(UTC)
    held = pool.try_acquire("ann", "", 1)
    # dan's job holds the other GPU, running, with a timeout of 20 min.
    jobs = JobLedger(pool)
    job = jobs.create("dan", [], "p", ["python"], "/home/dan", 1200, "node", 1000, 100)
    job_lease = pool.try_acquire("dan", job_server_name(job.id), 1)
    # An admin's booking (a plain user's would need an hour's notice): on ann's GPU, the first.
    later = pool.book("bob", 1, now + 30 * M, now + 90 * M, admin=True)
    assert job_lease is not None and job_lease.gpu_uuids != held.gpu_uuids and later.gpu_uuids == held.gpu_uuids
    job = jobs.update(job.id, None, "started_at", state=RUNNING, lease_id=job_lease.id)
    for user in ("cy", "dee"):  # their queue rows, as their waiting spawns write them
        waiting = pool._write(pool._attempt, pool._make_request(user, "", 1, [], None), None, True)
        assert waiting.lease is None and waiting.waiter_id is not None

    servers = [Server("ann", "", lease_id=held.id, host="node", gpu_uuids=held.gpu_uuids, ready=True,
                      last_activity=now, started=now)]
    try:
        with serving(pool, servers) as port:
            got = requests.get(f"http://127.0.0.1:{port}/services/gpu-pool/api/wait", headers={"X-User": "cy"},
                               timeout=30).json()
            cy, dee = got["queue"]
            # cy, first: dan's job is stopped at its timeout (his name hidden from her).
            ends = job.started_at + timedelta(seconds=1200)
            assert cy["yours"] and cy["estimate_why"] == f"a job reaches its timeout at {ends:%H:%M} UTC"
            assert 20 * 60 - 120 < cy["estimate_s"] <= 20 * 60
            # dee, next: ann's GPU is hers only when bob's booking of it ends.
            assert dee["estimate_why"] == f"a booking of a GPU ends at {later.ends_at:%H:%M} UTC"
            assert 90 * 60 - 120 < dee["estimate_s"] <= 90 * 60 and dee["estimate"].endswith("(estimate)")
            assert "booking" in got["note"] and "job's timeout" in got["note"]
    finally:
        pool.close()


@contextlib.contextmanager
def serving(pool, servers: list):
    """The pool service's app on a free port, the hub's server list stood in for by `servers`
    and its login by the X-User header; yields the port."""
    from tests.fixtures.pool_app import serving_app

    class Hub:
        async def servers_of_user(self, name):
            return [s for s in servers if s.user == name]

    def current_user(self):
        return {"name": self.request.headers["X-User"], "scopes": [], "kind": "user", "groups": []}

    with serving_app(pool, current_user, hub_api=Hub()) as url:
        yield int(url.split(":")[2].split("/")[0])


def test_a_waiter_is_told_when_the_holders_gpu_hour_budget_runs_out(tmp_path):
    """ann has used 9.5 of her 10 GPU-hours a week and holds the only GPU (an active server, so
    the culler stops it when her budget runs out): cy, waiting, is told that end, about 30 min."""
    import requests
    from sqlalchemy import insert

    from spawner.pool.history.rollup import record_ended
    from spawner.pool.ledger.schema import lease_gpus_table, leases_table
    from spawner.services.hub_api import Server
    from tests.unit.test_pool_fairshare import make_pool

    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=1, gpu_hour_budget=10.0)
    now = datetime.now(UTC)
    uuid = pool.gpus()[0].gpu.uuid

    def past(conn):  # 9.5 GPU-hours ann used yesterday
        lid = conn.execute(insert(leases_table).values(
            user_name="ann", server_name="old", host="node", groups="[]", started_at=now - 30 * H,
            ended_at=now - 30 * H + timedelta(hours=9.5), end_reason="stopped")).inserted_primary_key[0]
        conn.execute(insert(lease_gpus_table).values(lease_id=lid, uuid=uuid, host="node", position=0,
                                                     ended_at=now - 30 * H + timedelta(hours=9.5)))
        record_ended(pool._store, conn, [lid])
    pool._write(past)
    held = pool.try_acquire("ann", "", 1)
    waiting = pool._write(pool._attempt, pool._make_request("cy", "", 1, [], None), None, True)
    assert waiting.lease is None and waiting.waiter_id is not None
    servers = [Server("ann", "", lease_id=held.id, host="node", gpu_uuids=held.gpu_uuids, ready=True,
                      last_activity=now, started=now)]
    try:
        with serving(pool, servers) as port:
            got = requests.get(f"http://127.0.0.1:{port}/services/gpu-pool/api/wait", headers={"X-User": "cy"},
                               timeout=30).json()
        (cy,) = got["queue"]
        assert cy["yours"] and cy["estimate_why"].startswith("a server is stopped at ")
        assert cy["estimate_why"].endswith("UTC, when its GPU-hour budget runs out"), cy
        assert 30 * 60 - 120 < cy["estimate_s"] <= 30 * 60
        assert "GPU-hour budget" in got["note"]
    finally:
        pool.close()


def test_a_job_that_would_run_into_someone_elses_booking_waits_for_its_end():
    # g1 is free now, bob booked it 12:30-14:00: a server may use it until then, a job of 1 h may not.
    b = booking("bob", "g1", NOW + 30 * M, NOW + 2 * H)
    free = [("node", "g1")]
    assert estimate.waits_explained([1], 1, [], NOW, LENGTHS, bookings=[b], who=[("cy", ())], free_slots=free) == [
        (0.0, "GPUs are free now")]
    assert estimate.waits_explained([1], 1, [], NOW, LENGTHS, bookings=[b], who=[("cy", ())], free_slots=free,
                                    holds=[3600.0]) == [(2 * 3600.0, "a booking of a GPU ends at 14:00 UTC")]
    # A job short enough to be done before the booking starts takes it now.
    assert estimate.waits_explained([1], 1, [], NOW, LENGTHS, bookings=[b], who=[("cy", ())], free_slots=free,
                                    holds=[600.0]) == [(0.0, "GPUs are free now")]


def test_api_wait_gives_a_queued_job_the_estimate_its_grant_follows(tmp_path):
    """dan's queued job (1 h timeout) waits for the only GPU, free now but booked by bob from in
    30 min: the grant lends it none (holds_for), and api/wait tells him it waits for the booking's
    end, not that GPUs are free now."""
    from dataclasses import replace

    import requests

    from spawner.pool.ledger.job_records import JobLedger, job_server_name
    from tests.unit.test_pool_fairshare import make_pool

    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=1)
    now = datetime.now(UTC)
    later = pool.book("bob", 1, now + 30 * M, now + 90 * M)
    job = JobLedger(pool).create("dan", [], "p", ["python"], "/home/dan", 3600, "node", 1000, 100)
    req = replace(pool._make_request("dan", job_server_name(job.id), 1, [], None), holds_for=job.holds_for)
    waiting = pool._write(pool._attempt, req, None, True)  # its queue row, as the job runner's acquire writes it
    assert waiting.lease is None and waiting.waiter_id is not None
    try:
        with serving(pool, []) as port:
            got = requests.get(f"http://127.0.0.1:{port}/services/gpu-pool/api/wait", headers={"X-User": "dan"},
                               timeout=30).json()
        (row,) = got["queue"]
        assert row["estimate_why"] == f"a booking of a GPU ends at {later.ends_at:%H:%M} UTC", row
        assert 90 * 60 - 120 < row["estimate_s"] <= 90 * 60
    finally:
        pool.close()
