"""Bookings: the ledger's guarantee, the warning and the stop at the window's start, no-shows,
every limit, and hostile requests through the pool service's API (SQLite here; PostgreSQL in
tests/integration/test_pool_fairshare_postgres.py)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
import requests

from devservices.waiting import async_until, until
from spawner.culling.policy import GPUCullPolicy, LedgerBookings
from spawner.inventory import SimulatedInventory
from spawner.pool import GPUPool, InvalidRequest, WaitTimeout
from spawner.pool.fair_use import bookings
from spawner.pool.fair_use.bookings import BookingRefused
from tests.fixtures.pool_app import serving_app

HOST = "node-1"
H = timedelta(hours=1)


def make_pool(url: str, gpus: int = 2, **kwargs) -> GPUPool:
    pool = GPUPool(inventory=SimulatedInventory(count=gpus, host=HOST), db_url=url, poll_interval=0.05, **kwargs)
    pool.sync_inventory()
    return pool


def booked_at(pool: GPUPool, made_at: datetime, **kw) -> bookings.Booking:
    """A booking made at a past time (the API refuses windows in the past; history may hold them)."""
    return pool._write(lambda conn: bookings.make(conn, made_at, created_by=kw["user"], limits=pool.booking_limits(),
                                                  group=kw.get("group"), host=None, **{k: v for k, v in kw.items()
                                                                                       if k != "group"}))


def guarantee_warning_stop_and_no_show(url: str) -> None:
    pool = make_pool(url, gpus=1)
    now = datetime.now(UTC)
    # Before the window: alice gets the GPU and is told it is booked later.
    early = pool.book("bob", 1, now + 2 * H, now + 4 * H)
    lease = pool.try_acquire("alice", "", 1)
    assert lease is not None and lease.notice.startswith(
        f"This GPU is booked from {early.starts_at.strftime('%a %H:%M')} UTC, in 1")  # 119 or 120 min
    assert "; your server will be stopped then (reason: booking)" in lease.notice
    pool.release(lease.id)
    pool.cancel_booking(early.id, "bob")

    # A window that starts now: nobody else is lent the GPU, the booker is at once.
    held = pool.try_acquire("carol", "", 1)  # holds it from before the window
    b = pool.book("bob", 1, now, now + 2 * H, admin=True)  # an admin's booking may start at once
    # The culler stops carol's server: it is booked by someone else now (reason booking).
    verdict = GPUCullPolicy(3600, 900, booked_out=LedgerBookings(pool)).decide(
        timedelta(seconds=1), {"name": "", "url": "/user/carol/", "state": {"gpu_lease_id": held.id,
                                                                             "gpu_uuids": list(held.gpu_uuids)}})
    assert verdict.cull and verdict.end_reason == "booking" and f"booking {b.id}" in verdict.reason
    pool.release(held.id, verdict.end_reason)
    assert pool.lease(held.id).end_reason == "booking"
    assert pool.try_acquire("dave", "", 1) is None  # not lent into the window to others
    mine = pool.try_acquire("bob", "", 1)
    assert mine is not None and mine.gpu_uuids == b.gpu_uuids
    pool.release(mine.id)

    # A group's booking: its members may use it, others not.
    pool.cancel_booking(b.id, "bob")
    g = pool.book("ada", 1, now, now + H, group="course", by="ada")
    assert pool.try_acquire("erin", "", 1, groups=["other"]) is None
    lease = pool.try_acquire("erin", "", 1, groups=["course"])
    assert lease is not None
    pool.release(lease.id)
    pool.cancel_booking(g.id, "ada", admin=True)

    # A no-show: unused for longer than the grace after its start, it goes back to the pool.
    stale = booked_at(pool, now - timedelta(minutes=20), user="frank", count=1,
                      starts_at=now - timedelta(minutes=20), ends_at=now + H)
    assert [x.id for x in pool.bookings()] == []  # released (grace: 15 min)
    assert pool.try_acquire("gina", "", 1) is not None
    assert stale.id
    pool.close()


def test_a_booking_holds_its_gpus_warns_stops_and_frees_on_no_show(tmp_path):
    guarantee_warning_stop_and_no_show(f"sqlite:///{tmp_path}/l.sqlite")


def test_a_waiter_does_not_get_a_booked_gpu_but_the_booker_does(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=1)
    now = datetime.now(UTC)
    held = pool.try_acquire("carol", "", 1)
    pool.book("bob", 1, now, now + H, admin=True)

    async def main():
        dave = asyncio.ensure_future(pool.acquire("dave", "", 1, timeout=60))
        await async_until(pool.queue, what="dave in the queue")
        bob = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=30))
        await async_until(lambda: len(pool.queue()) == 2, what="bob in the queue behind dave")
        pool.release(held.id)
        got = await bob  # while dave, who waited first, still waits ahead of him (the GPU is not his)
        assert [w.user for w in pool.queue()] == ["dave"] and not dave.done()
        dave.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dave
        return got
    assert asyncio.run(main()).user == "bob"
    pool.close()


def test_a_waiter_gets_a_no_shows_gpu_once_its_grace_has_passed(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=1, booking_grace=1.0)
    now = datetime.now(UTC)
    b = pool.book("dee", 1, now, now + H)

    async def main():
        alice = asyncio.ensure_future(pool.acquire("alice", "", 1, timeout=120))
        await async_until(pool.queue, what="alice in the queue")
        assert not alice.done()  # the booking holds the GPU while dee may still come
        # Her own waiting releases the booking once its grace has passed (not at her wait's end).
        return await asyncio.wait_for(alice, 30)
    lease = asyncio.run(main())
    assert lease.user == "alice" and lease.started_at >= b.starts_at + timedelta(seconds=1)
    assert pool.bookings() == []
    pool.close()


def test_a_job_is_not_lent_a_gpu_booked_for_someone_else_before_its_timeout(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=1)
    now = datetime.now(UTC)
    pool.book("bob", 1, now + timedelta(minutes=30), now + H)

    async def main():
        # An hour's job would run into bob's window, and nothing stops a job there: it waits.
        with pytest.raises(WaitTimeout):
            await pool.acquire("ann", "job/1", 1, timeout=0.3, holds_for=3600)
        # A 10-minute job ends before it: lent. So is a notebook server (told, and stopped then).
        short = await pool.acquire("ann", "job/2", 1, timeout=5, holds_for=600)
        pool.release(short.id)
        server = await pool.acquire("ann", "", 1, timeout=5)
        assert server.notice and server.notice.startswith("This GPU is booked from")
        pool.release(server.id)
        # bob's own job may hold it into his window.
        mine = await pool.acquire("bob", "job/3", 1, timeout=5, holds_for=3600)
        pool.release(mine.id)
    asyncio.run(main())
    with pytest.raises(InvalidRequest, match="holds_for must be a number of seconds"):
        asyncio.run(pool.acquire("ann", "job/4", 1, timeout=1, holds_for=-1))
    pool.close()


def test_the_pool_page_books_by_the_lending_hubs_limits(tmp_path):
    url = f"sqlite:///{tmp_path}/l.sqlite"
    hub = make_pool(url, gpus=2, booking_max_hours=2, booking_grace=60)
    page = GPUPool(db_url=url)  # the pool service's and the culler's: no inventory, no configuration
    try:
        assert (page.booking_limits().max_hours, page.booking_limits().grace_s) == (2, 60)
        now = datetime.now(UTC)
        with pytest.raises(BookingRefused, match="at most 2 hours"):
            page.book("bob", 1, now + H, now + 4 * H)
        assert page.bookings() == []
    finally:
        page.close()
        hub.close()


LIMITS = dict(booking_max_hours=4, booking_max_days_ahead=7, booking_max_gpu_hours_per_week=10,
              booking_max_per_user=3)


@pytest.mark.parametrize("start, end, count, message", [
    (-2 * H, -H, 1, "starts in the past"),
    (H, H, 1, "must end after it starts"),
    (2 * H, H, 1, "must end after it starts"),
    (H, 6 * H, 1, "at most 4 hours"),
    (timedelta(days=365), timedelta(days=365) + H, 1, "at most 7 days ahead"),
    (H, 2 * H, 3, "has 2 GPUs to lend"),
    (H, 2 * H, 0, "count must be a whole number of GPUs >= 1"),
    (H, 2 * H, -1, "count must be a whole number of GPUs >= 1"),
])
def test_impossible_bookings_are_refused_with_a_reason(tmp_path, start, end, count, message):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", **LIMITS)
    now = datetime.now(UTC)
    with pytest.raises(Exception) as refused:
        pool.book("bob", count, now + start, now + end)
    assert message in str(refused.value) and getattr(refused.value, "status_code", 0) == 400
    assert pool.bookings() == []


def test_overlaps_name_the_next_free_window_and_limits_hold_per_user(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", **LIMITS)
    now = datetime.now(UTC).replace(microsecond=0)
    first = pool.book("ann", 2, now + H, now + 3 * H)
    with pytest.raises(BookingRefused) as refused:
        pool.book("bob", 1, now + 2 * H, now + 4 * H)
    assert "other bookings hold them; the next free window of that length is" in str(refused.value)
    assert (first.ends_at.strftime("%H:%M") + " to " + (first.ends_at + 2 * H).strftime("%H:%M")) in str(refused.value)
    with pytest.raises(BookingRefused) as weekly:
        pool.book("ann", 2, now + 4 * H, now + 8 * H)  # 4 + 8 > 10 GPU-hours in a week
    assert "would pass the 10 a user may book in a week" in str(weekly.value)
    pool.book("ann", 1, now + 4 * H, now + 5 * H)
    pool.book("ann", 1, now + 6 * H, now + 7 * H)
    with pytest.raises(BookingRefused) as many:
        pool.book("ann", 1, now + 8 * H, now + 9 * H)
    assert "the most one user may hold" in str(many.value)
    assert len(pool.bookings()) == 3


# --- the API -------------------------------------------------------------------------------


@pytest.fixture
def service(tmp_path):
    """The pool service's app on a free port; the hub's login stood in for by headers."""
    from spawner.poolpage import ADMIN_SCOPE

    def current_user(self):
        name = self.request.headers.get("X-User")
        if not name:
            return None
        scopes = [ADMIN_SCOPE] if self.request.headers.get("X-Admin") else []
        return {"name": name, "scopes": scopes, "kind": "user", "groups": []}

    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", **LIMITS)
    with serving_app(pool, current_user) as url:
        yield url, pool
    pool.close()


def post(url, body, user="bob", admin=False):
    headers = {"X-User": user, **({"X-Admin": "1"} if admin else {})}
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(url + "api/bookings", data=data, headers=headers, timeout=30)


def test_the_api_books_lists_and_refuses_hostile_bookings_changing_nothing(service):
    url, pool = service
    now = datetime.now(UTC)
    t = lambda d: (now + d).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    r = post(url, {"count": 1, "starts_at": t(H), "ends_at": t(2 * H)})
    assert r.status_code == 201, r.text
    assert r.json()["user"] == "bob" and r.json()["gpus"] == 1
    hostile = [
        ({"count": 1, "starts_at": t(-2 * H), "ends_at": t(-H)}, 400, "starts in the past"),
        ({"count": 1, "starts_at": t(H), "ends_at": t(H)}, 400, "must end after it starts"),
        ({"count": 1, "starts_at": t(3 * H), "ends_at": t(H)}, 400, "must end after it starts"),
        ({"count": 1, "starts_at": t(timedelta(days=365)), "ends_at": t(timedelta(days=365) + H)}, 400, "days ahead"),
        ({"count": 99, "starts_at": t(H), "ends_at": t(2 * H)}, 400, "has 2 GPUs to lend"),
        ({"count": 2, "starts_at": t(H), "ends_at": t(2 * H)}, 400, "the next free window"),
        ({"count": 1, "starts_at": t(H), "ends_at": t(2 * H), "group": "course"}, 403, "Only a GPU pool admin"),
        ({"count": 1, "starts_at": t(H), "ends_at": t(2 * H), "user": "alice"}, 403, "Only a GPU pool admin"),
        ({"count": "1", "starts_at": t(H), "ends_at": t(2 * H)}, 400, "whole number"),
        ({"count": 1, "starts_at": "tomorrow", "ends_at": t(2 * H)}, 400, "not an ISO 8601"),
        ({"count": 1, "starts_at": t(H), "ends_at": t(2 * H), "image": "evil"}, 400, "Unknown keys ['image']"),
        ([1, 2], 400, "must be a JSON object"),
        ("{not json", 400, "must be JSON"),
        ("x" * 5000, 400, "larger than 4096 bytes"),
    ]
    for body, status, message in hostile:
        r = post(url, body)
        assert r.status_code == status and message in r.json()["message"], (body, r.status_code, r.text)
    listed = requests.get(url + "api/bookings", headers={"X-User": "eve"}, timeout=30).json()
    assert [b["user"] for b in listed["bookings"]] == [None]  # one booking, its booker hidden from eve
    assert listed["limits"]["max_hours"] == 4
    # An admin books for a group; eve may not cancel bob's; bob may.
    r = post(url, {"count": 1, "starts_at": t(5 * H), "ends_at": t(6 * H), "group": "course"}, user="ada",
             admin=True)
    assert r.status_code == 201 and r.json()["group"] == "course"
    bid = listed["bookings"][0]["id"]
    assert requests.delete(f"{url}api/bookings/{bid}", headers={"X-User": "eve"}, timeout=30).status_code == 403
    assert requests.delete(f"{url}api/bookings/{bid}", headers={"X-User": "bob"}, timeout=30).status_code == 200
    assert [b.group for b in pool.bookings()] == ["course"]
    # The page shows the form and the per-GPU timeline.
    page = requests.get(url, headers={"X-User": "bob"}, timeout=30).text
    assert 'id="booking-form"' in page and 'id="booking-timeline"' in page and "(group course)" in page


def test_gpu_pool_book_and_bookings(tmp_path, capsys):
    from spawner.cli import main

    url = f"sqlite:///{tmp_path}/l.sqlite"
    make_pool(url).close()
    now = datetime.now(UTC)
    start, end = (now + H).strftime("%Y-%m-%dT%H:%M"), (now + 2 * H).strftime("%Y-%m-%dT%H:%M")
    assert main(["--db-url", url, "book", "--user", "bob", "--count", "2", "--start", start, "--end", end]) == 0
    assert "Booked 2 GPU(s) on node-1" in capsys.readouterr().out
    assert main(["--db-url", url, "book", "--user", "ann", "--start", start, "--end", end]) != 0
    assert "the next free window" in capsys.readouterr().err
    assert main(["--db-url", url, "--json", "bookings"]) == 0
    (b,) = json.loads(capsys.readouterr().out)
    assert b["user"] == "bob" and b["gpus"] == 2
    assert main(["--db-url", url, "unbook", str(b["id"])]) == 0


# --- not an eviction button (issue 42, item 2) ----------------------------------------------


def test_a_plain_users_booking_of_gpus_in_use_waits_the_notice_and_their_holders_are_told(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=2)
    now = datetime.now(UTC)
    carol = pool.try_acquire("carol", "", 1)
    dan = pool.try_acquire("dan", "", 1)
    # Both GPUs in use: from now, or within the hour, is refused, naming when it may start.
    for start in (now, now + timedelta(minutes=30)):
        with pytest.raises(BookingRefused) as refused:
            pool.book("bob", 1, start, start + H, groups=["ml"])
        assert "at least 60 minutes ahead (GPUPool.booking_notice)" in str(refused.value)
        assert f"Book from {(now + H).strftime('%a %H:%M')} UTC on" in str(refused.value)
    assert pool.bookings() == []
    # With the notice, it is booked, and carol's server and dan's are told at once how long they have.
    b = pool.book("bob", 1, now + H + timedelta(minutes=1), now + 2 * H)
    holder = carol if b.gpu_uuids == carol.gpu_uuids else dan
    told = pool.booking_notice_for(HOST, holder.gpu_uuids, holder.user)
    assert told.startswith(f"This GPU is booked from {b.starts_at.strftime('%a %H:%M')} UTC, in 6")  # 60-61 min
    assert "your server will be stopped then (reason: booking)" in told
    assert "this job will be stopped" in pool.booking_notice_for(HOST, holder.gpu_uuids, holder.user, (), "this job")
    assert pool.booking_notice_for(HOST, holder.gpu_uuids, "bob") is None  # the booker's own
    # One GPU free: a booking from now takes that one, and stops nobody.
    pool.release(dan.id)
    now_b = pool.book("eve", 1, now, now + H)
    assert now_b.gpu_uuids == dan.gpu_uuids
    # A GPU pool admin's booking may start at once on GPUs in use (the culler stops them then).
    pool.cancel_booking(now_b.id, "eve")
    assert pool.book("ann", 2, now + 3 * H, now + 4 * H, admin=True).gpu_uuids
    assert pool.book("ann", 1, now, now + timedelta(minutes=30), admin=True, by="ada").gpu_uuids
    pool.close()


def test_a_user_books_no_more_than_their_quota(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=2, max_gpus_per_user=1, group_gpu_limits={"big": 2})
    now = datetime.now(UTC)
    with pytest.raises(BookingRefused, match=r"You may hold 1 GPU at once .*you asked for 2 GPUs"):
        pool.book("bob", 2, now + H, now + 2 * H, groups=["ml"])
    assert pool.book("bob", 2, now + H, now + 2 * H, groups=["big"]).gpu_uuids
    assert pool.book("ann", 2, now + 3 * H, now + 4 * H, admin=True).gpu_uuids  # an admin books for anyone
    pool.close()


def test_cancelled_and_released_bookings_count_in_the_weekly_cap(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", **LIMITS)  # 10 GPU-hours a week
    now = datetime.now(UTC)
    first = pool.book("ann", 2, now + H, now + 5 * H)  # 8 GPU-hours
    pool.cancel_booking(first.id, "ann")
    with pytest.raises(BookingRefused) as weekly:  # book, cancel, book again: the 8 still count
        pool.book("ann", 2, now + H, now + 3 * H)
    assert "You have 8.0 GPU-hours booked within a week" in str(weekly.value)
    assert pool.book("ann", 1, now + H, now + 3 * H).gpu_uuids  # 8 + 2 = 10: just within
    pool.close()


def test_used_is_per_gpu_an_unused_gpu_of_a_booking_goes_back(tmp_path):
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", gpus=2, booking_grace=1.0)
    now = datetime.now(UTC)
    b = pool.book("dee", 2, now, now + H)
    mine = pool.try_acquire("dee", "", 1)  # dee uses one of the two
    assert mine is not None and pool.try_acquire("alice", "", 1) is None  # the other is still held
    until(lambda: datetime.now(UTC) >= b.starts_at + timedelta(seconds=1.05), what="the grace's own end")
    [kept] = pool.bookings()
    assert kept.id == b.id and kept.gpu_uuids == mine.gpu_uuids
    other = pool.try_acquire("alice", "", 1)
    assert other is not None and other.gpu_uuids != mine.gpu_uuids
    pool.close()


def test_the_api_books_no_more_than_the_users_profiles_take(tmp_path):
    from spawner.poolpage.service_config import PoolPageSettings

    def current_user(self):
        name = self.request.headers.get("X-User")
        return {"name": name, "scopes": [], "kind": "user", "groups": self.request.headers.get("X-Groups", "").split()}

    profiles = [{"slug": "gpu-1", "display_name": "1", "image": "i", "gpus": 1},
                {"slug": "gpu-2", "display_name": "2", "image": "i", "gpus": 2, "groups": ["big"]}]
    pool = make_pool(f"sqlite:///{tmp_path}/l.sqlite", **LIMITS)
    now = datetime.now(UTC)
    body = {"count": 2, "starts_at": (now + H).isoformat(), "ends_at": (now + 2 * H).isoformat()}
    with serving_app(pool, current_user, page=PoolPageSettings(profiles=profiles)) as base:
        url = base + "api/bookings"
        r = requests.post(url, json=body, headers={"X-User": "bob"}, timeout=30)
        assert r.status_code == 400 and "Your profiles (gpu-1) take at most 1 GPU(s) each" in r.json()["message"]
        assert pool.bookings() == []
        r = requests.post(url, json=body, headers={"X-User": "cy", "X-Groups": "big"}, timeout=30)
        assert r.status_code == 201, r.text
        assert requests.get(url, headers={"X-User": "cy"}, timeout=30).json()["limits"]["notice_s"] == 3600
    pool.close()
