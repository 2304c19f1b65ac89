"""The pool service's routes against hostile numbers and reads: ids past 64 bits, times at the
edge of the calendar, periods without end, reads that must not wait on the ledger's write lock,
and the hub asked only for what an answer needs (the service's app on 127.0.0.1, a real SQLite
ledger, the hub's login stood in for by the X-User header)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest
import requests

from spawner.engines import make_job_engine
from spawner.inventory import SimulatedInventory
from spawner.jobs import JOBS_SCOPE
from spawner.jobs.runner import JobRunner
from spawner.jobs.runner_settings import JobSettings
from spawner.pool import GPUPool
from spawner.profiles import DEFAULT_PROFILES
from tests.fixtures.pool_app import serving_app

HOST = "node-1"
PREFIX = "/services/gpu-pool/"
BIG = ["9999999999999999999", "1" * 25, "9" * 5000]  # past int64; far past it; past int()'s digits


class Hub:
    """The hub's REST API as the service calls it (hubapi.HubAPI), counting each call."""

    def __init__(self, servers=()):
        self.servers = list(servers)
        self.listed = 0  # GET /users?state=active (every active user, page by page)
        self.asked: list[str] = []  # GET /users/<name>

    async def active_servers(self):
        self.listed += 1
        return list(self.servers)

    async def servers_of_user(self, name):
        self.asked.append(name)
        return [s for s in self.servers if s.user == name]


@contextlib.contextmanager
def serving(pool, jobs=None, hub=None, limits=None):
    """The service's app on a free port; yields its URL."""
    def current_user(self):
        name = self.request.headers.get("X-User")
        if not name:
            return None
        scopes = [JOBS_SCOPE] + (["custom:gpu-pool:admin"] if self.request.headers.get("X-Admin") else [])
        return {"name": name, "scopes": scopes, "kind": "user", "groups": []}

    with serving_app(pool, current_user, hub_api=hub, jobs=jobs, limits=limits) as url:
        yield url


def make_pool(tmp_path, **kwargs) -> GPUPool:
    pool = GPUPool(inventory=SimulatedInventory(count=2, host=HOST), db_url=f"sqlite:///{tmp_path}/l.sqlite",
                   **kwargs)
    pool.sync_inventory()
    return pool


@pytest.fixture
def errors(caplog):
    """The service's logged errors (a 500's traceback is logged at ERROR)."""
    caplog.set_level(logging.WARNING)
    yield lambda: [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_ids_past_64_bits_are_not_found_in_every_route(tmp_path, errors):
    pool = make_pool(tmp_path)
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=HOST), make_job_engine(js))
    mine = runner.ledger.create("pat", [], "tf-gpu-1", ["true"], "", 60, HOST, 1000, 100)
    user = {"X-User": "pat"}
    try:
        with serving(pool, jobs=runner) as url:
            for big in BIG:
                for method, path in [("DELETE", f"api/bookings/{big}"), ("GET", f"api/jobs/{big}"),
                                     ("DELETE", f"api/jobs/{big}"), ("GET", f"api/jobs/{big}/logs"),
                                     ("GET", f"api/jobs/{big}/logs?follow=1"), ("GET", f"jobs/{big}")]:
                    r = requests.request(method, url + path, headers=user, timeout=30)
                    assert r.status_code == 404, (method, path[:40], r.status_code, r.text[:300])
                    assert "Traceback" not in r.text and "Overflow" not in r.text
            # The same routes still find what is there.
            assert requests.get(f"{url}api/jobs/{mine.id}", headers=user, timeout=30).json()["id"] == mine.id
            assert requests.delete(f"{url}api/bookings/4242", headers=user, timeout=30).status_code == 404
        assert errors() == []
    finally:
        pool.close()


def test_the_pools_own_calls_find_nothing_past_64_bits(tmp_path):
    from spawner.pool.fair_use.bookings import UnknownBooking

    pool = make_pool(tmp_path)
    big = int("9" * 23)
    try:
        assert pool.lease(big) is None
        assert pool.release(big) is False and pool.release_all([big]) == []
        assert pool.lease_booked_out(big) is None and pool.set_problem(big, "x") is False
        with pytest.raises(UnknownBooking, match=f"No live booking {big}"):
            pool.cancel_booking(big, "pat")
        from spawner.pool.ledger.job_records import JobLedger
        assert JobLedger(pool).get(big) is None and JobLedger(pool).log(big) is None
    finally:
        pool.close()


@contextlib.contextmanager
def write_lock_held_elsewhere(url: str):
    """Another process's ledger (a second GPUPool on the file) holding the write lock."""
    other = GPUPool(db_url=url)
    held, release = threading.Event(), threading.Event()

    def hold(conn):
        held.set()
        release.wait(30)
    thread = threading.Thread(target=other._write, args=(hold,), daemon=True)
    thread.start()
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)
        other.close()


def test_listing_bookings_and_viewing_the_page_take_no_write_lock(tmp_path, errors):
    from datetime import UTC, datetime, timedelta

    pool = make_pool(tmp_path, lock_timeout=2.0)
    now = datetime.now(UTC)
    pool.book("bob", 1, now + timedelta(hours=1), now + timedelta(hours=2))
    try:
        with serving(pool, hub=Hub()) as url, write_lock_held_elsewhere(f"sqlite:///{tmp_path}/l.sqlite"):
            started = time.monotonic()
            r = requests.get(url + "api/bookings", headers={"X-User": "bob"}, timeout=30)
            assert r.status_code == 200, r.text
            assert [b["user"] for b in r.json()["bookings"]] == ["bob"]
            page = requests.get(url, headers={"X-User": "bob"}, timeout=30)
            assert page.status_code == 200 and 'id="booking-timeline"' in page.text
            # Neither waited for the lock (2 s, then 503 "stayed locked").
            assert time.monotonic() - started < 1.5
    finally:
        pool.close()


def test_a_no_show_is_left_out_of_the_list_before_any_write_releases_it(tmp_path):
    from datetime import UTC, datetime, timedelta

    from spawner.pool.fair_use import bookings

    pool = make_pool(tmp_path)
    now = datetime.now(UTC)
    pool._write(lambda conn: bookings.make(conn, now - timedelta(minutes=20), user="frank", group=None, count=1,
                                           starts_at=now - timedelta(minutes=20), ends_at=now + timedelta(hours=1),
                                           host=None, created_by="frank", limits=pool.booking_limits()))
    try:
        assert pool.bookings() == []  # unused past its grace (15 min): not shown, not holding anything
        assert pool.try_acquire("gina", "", 2) is not None  # and the grant releases it
    finally:
        pool.close()


EDGES = ["0001-01-01T00:00+01:00",  # before year 1 in UTC
         "9999-12-31T23:59-01:00",  # after 9999 in UTC
         "0001-01-01", "9999-12-31T23:59:59Z"]  # inside the calendar, but a period from them is not


def test_times_at_the_calendars_edge_are_a_400_with_a_message(tmp_path, errors):
    pool = make_pool(tmp_path)
    bob = {"X-User": "bob"}
    try:
        with serving(pool, hub=Hub()) as url:
            for edge in EDGES:
                for path in (f"api/usage?since={edge}", f"api/usage?until={edge}", f"api/usage.csv?since={edge}",
                             f"api/occupancy?since={edge}", f"api/occupancy?until={edge}",
                             f"api/occupancy.csv?until={edge}"):
                    r = requests.get(url + path.replace("+", "%2B"), headers=bob, timeout=30)
                    assert r.status_code == 400, (path, r.status_code, r.text[:300])
                    assert "outside the times the pool answers for" in r.json()["message"], (path, r.text)
                r = requests.post(url + "api/bookings", headers=bob, timeout=30,
                                  json={"count": 1, "starts_at": edge, "ends_at": edge})
                assert r.status_code == 400 and "outside the times" in r.json()["message"], (edge, r.text)
                page = requests.get(url + f"?since={edge.replace('+', '%2B')}", headers=bob, timeout=30)
                assert page.status_code == 400 and "outside the times" in page.text, (edge, page.status_code)
            # Inside the range, as before: a period from 1900 is everything the ledger holds.
            r = requests.get(url + "api/usage?since=1900-01-01&until=8999-12-31T23:00%2B05:00", headers=bob,
                             timeout=30)
            assert r.status_code == 200, r.text
        assert errors() == []
    finally:
        pool.close()


def test_api_occupancy_covers_a_bounded_period(tmp_path, errors):
    from spawner.poolpage.limits import PoolServiceLimits

    pool = make_pool(tmp_path)
    bob = {"X-User": "bob"}
    try:
        with serving(pool, hub=Hub(), limits=PoolServiceLimits(occupancy_max_days=30)) as url:
            for query in ("since=1900-01-01", "since=2026-01-01&until=2026-03-01"):
                r = requests.get(f"{url}api/occupancy?{query}", headers=bob, timeout=30)
                assert r.status_code == 400, (query, r.text)
                assert r.json()["message"] == ("api/occupancy covers at most 30 days from since to until "
                                               "(PoolServiceLimits.occupancy_max_days); ask for a shorter period")
            r = requests.get(f"{url}api/occupancy?since=2026-01-01&until=2026-01-31", headers=bob, timeout=30)
            assert r.status_code == 200, r.text
            assert requests.get(f"{url}api/occupancy?period=30d", headers=bob, timeout=30).status_code == 200
        # The default: a year and a day.
        assert PoolServiceLimits().occupancy_max_days == 366
        assert errors() == []
    finally:
        pool.close()


def test_api_wait_asks_the_hub_only_for_the_servers_its_answer_needs(tmp_path, monkeypatch):
    """A hub with 500 other active users: api/wait never lists them.  With nobody waiting it
    reads the caller's own servers (their cull deadlines); with a queue, also the servers of
    the users holding GPUs (the estimate's idle deadlines); each user's answer is kept a few
    seconds, so callers in a burst share it."""
    from datetime import UTC, datetime

    from spawner.poolpage.handlers import wait
    from spawner.services.hub_api import Server

    monkeypatch.setattr(wait, "HUB_READ_MAX_AGE", 60.0)  # however slow this machine is today
    pool = make_pool(tmp_path)
    now = datetime.now(UTC)
    ann = pool.try_acquire("ann", "", 1)
    bob = pool.try_acquire("bob", "", 1)
    crowd = [Server(f"user{i}", "", ready=True, last_activity=now, started=now) for i in range(500)]
    held = [Server(u, "", lease_id=lease.id, host=HOST, gpu_uuids=lease.gpu_uuids, ready=True, last_activity=now,
                   started=now) for u, lease in (("ann", ann), ("bob", bob))]
    hub = Hub(crowd + held)
    try:
        with serving(pool, hub=hub) as url:
            r = requests.get(url + "api/wait", headers={"X-User": "ann"}, timeout=30)
            assert r.status_code == 200, r.text
            assert hub.listed == 0 and hub.asked == ["ann"]
            # cy waits: the estimate needs the holders' servers, and only theirs.
            waiting = pool._write(pool._attempt, pool._make_request("cy", "", 1, [], None), None, True)
            assert waiting.waiter_id is not None
            got = [requests.get(url + "api/wait", headers={"X-User": u}, timeout=30) for u in ("cy", "dee", "cy")]
            assert all(g.status_code == 200 for g in got) and got[0].json()["queue"][0]["yours"]
            assert hub.listed == 0
            assert sorted(hub.asked) == ["ann", "bob", "cy", "dee"]  # each once: kept for the next callers
    finally:
        pool.close()


def test_numbers_too_long_for_a_number_in_a_jobs_query_or_form_are_a_400(tmp_path, errors):
    from spawner.jobs.request import BadJob
    from spawner.poolpage.handlers.jobs import form_body

    with pytest.raises(BadJob, match="'timeout' must be a whole number"):
        form_body(lambda key: {"command": "python x.py", "timeout": "9" * 5000}.get(key))
    pool = make_pool(tmp_path)
    runner = JobRunner(pool, js := JobSettings(profiles=DEFAULT_PROFILES, host=HOST), make_job_engine(js))
    cluster = runner.ledger.create("pat", [], "tf-gpu-1", ["true"], "", 60, HOST, 1000, 100, workers=2)
    try:
        with serving(pool, jobs=runner) as url:
            for worker in ("9" * 5000, "9" * 25, "2"):
                r = requests.get(f"{url}api/jobs/{cluster.id}/logs?worker={worker}", headers={"X-User": "pat"},
                                 timeout=30)
                assert r.status_code == 400, (worker[:30], r.status_code, r.text[:200])
                assert f"'worker' must be a worker of job {cluster.id}: 0 to 1" in r.json()["message"]
        assert errors() == []
    finally:
        pool.close()
