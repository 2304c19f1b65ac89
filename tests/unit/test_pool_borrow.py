"""Borrowing beyond a share and reclaiming it (issue 38): the choice of the leases to reclaim
(pure), and the borrowed accounting on a real SQLite ledger: what is borrowed, what the quota
and the borrowing limits count, who waits for whom, which leases a waiting request asks back."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from devservices.waiting import async_until
from spawner.pool import EndReason, QuotaExceeded
from spawner.pool.fair_use.bookings import Booking
from spawner.pool.leasing.reclaim import Borrowed, booked_by_holder, choose

from .test_pool import HOST, make_pool

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def borrowed(id_, host="a", gpus=1, minute=0, server=None, user="alice") -> Borrowed:
    return Borrowed(id_, user, (), server or f"job/{id_}", host, tuple(f"{host}-{id_}-{i}" for i in range(gpus)),
                    T0 + timedelta(minutes=minute))


async def cancelled(task: asyncio.Future) -> None:
    """Cancel a waiting acquire and let it leave the queue."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# ------------------------------------------------------------------ the choice (pure)

def test_the_most_recently_started_borrowed_lease_goes_first():
    old, new = borrowed(1, minute=0), borrowed(2, minute=5)
    assert choose([old, new], {"a": 0}, {}, ["a"], 1) == [2]
    assert choose([old, new], {"a": 0}, {}, ["a"], 2) == [1, 2]


def test_nothing_is_reclaimed_when_free_or_coming_gpus_serve_the_request_or_nothing_would():
    lease = borrowed(1, gpus=2)
    assert choose([lease], {"a": 2}, {}, ["a"], 2) == []  # free enough
    assert choose([lease], {"a": 1}, {"a": 1}, ["a"], 2) == []  # one free, one being reclaimed already
    assert choose([lease], {"a": 0}, {}, ["a"], 3) == []  # even all of it would not serve 3


def test_a_cluster_is_reclaimed_as_a_whole_on_every_host():
    w0 = borrowed(1, host="a", server="job/9/worker-0", minute=1)
    w1 = borrowed(2, host="b", server="job/9/worker-1", minute=1)
    other = borrowed(3, host="a", minute=0)
    # The cluster started last: its worker on host a serves the request, and its worker on b goes too.
    assert choose([w0, w1, other], {"a": 0, "b": 0}, {}, ["a"], 1) == [1, 2]


def test_a_one_host_request_takes_the_host_that_needs_the_fewest_gpus_reclaimed():
    big = borrowed(1, host="a", gpus=3, minute=9)  # the newest, but on a host with nothing else free
    small = borrowed(2, host="b", gpus=1, minute=1)
    assert choose([big, small], {"a": 0, "b": 1}, {}, None, 2) == [2]


def test_a_gang_counts_gpus_on_any_of_its_hosts():
    a, b = borrowed(1, host="a", minute=2), borrowed(2, host="b", minute=1)
    assert choose([a, b], {"a": 0, "b": 0}, {}, ["a", "b"], 1, workers=2) == [1, 2]


def test_among_leases_started_together_the_holder_with_the_lowest_fair_share_priority_goes_first():
    heavy, light = borrowed(1, user="dave", minute=5), borrowed(2, user="carol", minute=5)
    standing = {"dave": 40.0, "carol": 0.5}
    assert choose([heavy, light], {"a": 0}, {}, ["a"], 1, standing=lambda u, g: standing[u]) == [1]
    # The start time still comes first: a newer lease of the lightest user goes before.
    newer = borrowed(3, user="carol", minute=6)
    assert choose([heavy, light, newer], {"a": 0}, {}, ["a"], 1, standing=lambda u, g: standing[u]) == [3]


def test_a_gang_counts_reclaimable_gpus_per_host_in_whole_workers():
    # 2 workers x 2 GPUs: a has one worker's 2 free, b one GPU.  The newest borrowed GPU, on c,
    # makes no worker's 2 there (by the total, 3 + 1 = 4, it would be reclaimed for nothing);
    # the older one on b makes b's.
    on_c, on_b = borrowed(1, host="c", minute=9), borrowed(2, host="b", minute=1)
    assert choose([on_c, on_b], {"a": 2, "b": 1, "c": 0}, {}, None, 2, workers=2) == [2]
    assert choose([on_c], {"a": 2, "b": 1, "c": 0}, {}, None, 2, workers=2) == []  # nothing would serve
    a1, b1 = borrowed(1, host="a", minute=9), borrowed(2, host="b", minute=8)
    a2, b2 = borrowed(3, host="a", minute=2), borrowed(4, host="b", minute=1)
    # With a GPU free on each host, one more on each makes a worker's worth there.
    assert choose([a1, b1, a2, b2], {"a": 1, "b": 1}, {}, ["a", "b"], 2, workers=2) == [1, 2]
    # Nothing free: both GPUs of a host for each worker; all four.
    assert choose([a1, b1, a2, b2], {"a": 0, "b": 0}, {}, ["a", "b"], 2, workers=2) == [1, 2, 3, 4]
    # One worker's 2 fit on a already (1 free + 1 coming): the newest on b alone is no worker's
    # worth, so it is passed over for the two that make b's.
    b3 = borrowed(5, host="b", gpus=2, minute=0)
    assert choose([b1, b3], {"a": 1, "b": 0}, {"a": 1}, ["a", "b"], 2, workers=2) == [5]


def test_a_lease_on_gpus_its_holder_booked_is_never_a_candidate():
    lease = borrowed(1, host="a", gpus=1)
    mine = Booking(5, "alice", None, "a", lease.uuids, T0 - timedelta(hours=1), T0 + timedelta(hours=1), "alice")
    theirs = Booking(6, "bob", None, "a", lease.uuids, T0 - timedelta(hours=1), T0 + timedelta(hours=1), "bob")
    assert booked_by_holder(lease, [mine], T0)
    assert not booked_by_holder(lease, [theirs], T0)
    assert not booked_by_holder(lease, [mine], T0 + timedelta(hours=2))  # over: an ordinary borrowed lease


# ------------------------------------------------------------------ the ledger

def test_a_borrowing_request_takes_idle_gpus_beyond_its_share_which_the_quota_does_not_count(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=1)
    try:
        with pytest.raises(QuotaExceeded, match="at most 1 GPU"):
            pool.try_acquire("alice", "job/1", 3)  # without asking to borrow: the quota as before
        lease = pool.try_acquire("alice", "job/1", 3, borrow=True)
        assert lease.borrowed and pool.lease(lease.id).borrowed and pool.lease(lease.id).to_dict()["borrowed"]
        own = pool.try_acquire("alice", "", 1)  # her share is still hers
        assert own is not None and not own.borrowed
        with pytest.raises(QuotaExceeded, match="you hold 1"):
            pool.try_acquire("alice", "two", 1)
        within = pool.try_acquire("bob", "job/2", 1, borrow=True)  # nothing free: None, nothing borrowed
        assert within is None
    finally:
        pool.close()


def test_borrowing_limits_refuse_with_a_403_naming_the_limit(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=0, max_borrowed_gpus_per_user=2, max_borrowed_jobs_per_user=1)
    try:
        with pytest.raises(QuotaExceeded, match=r"GPUPool\.max_borrowed_gpus_per_user") as refused:
            pool.try_acquire("alice", "job/1", 3, borrow=True)
        assert refused.value.status_code == 403
        with pytest.raises(QuotaExceeded, match=r"GPUPool\.max_borrowed_gpus_per_user"):
            pool.check_request("alice", 3, borrow=True, server_name="job/")
        assert pool.check_request("alice", 1, borrow=True, server_name="job/") is True  # would borrow
        assert pool.try_acquire("alice", "job/1", 1, borrow=True).borrowed
        with pytest.raises(QuotaExceeded, match=r"at most 1 job on borrowed GPUs .*max_borrowed_jobs_per_user"):
            pool.try_acquire("alice", "job/2", 1, borrow=True)
        with pytest.raises(QuotaExceeded, match=r"you borrow 1 and asked for 2 more"):
            pool.check_request("alice", 2, borrow=True, server_name="")
        assert not pool.queue() and len(pool.leases()) == 1  # refusals changed nothing
    finally:
        pool.close()


def test_a_waiter_within_its_share_asks_back_the_newest_borrowed_lease_and_gets_its_gpus(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=2)

    async def main():
        older = pool.try_acquire("alice", "job/1", 1, borrow=True)  # within her share of 2: not borrowed
        newer = pool.try_acquire("alice", "job/2", 3, borrow=True)  # 1 + 3 > 2: borrowed, as a whole
        assert newer.borrowed and not older.borrowed
        bob = asyncio.ensure_future(pool.acquire("bob", "", 2, timeout=30))
        [asked] = await async_until(lambda: pool.reclaiming(HOST), 10, "the borrowed lease asked back")
        assert asked.id == newer.id and asked.reclaim_at is not None
        assert pool.lease(newer.id).reclaim_at == asked.reclaim_at
        # While bob waits, nobody borrows: not even the one GPU nobody holds.
        assert pool.try_acquire("carol", "job/3", 1, borrow=True) is None
        assert pool.release(newer.id, EndReason.RECLAIMED)
        lease = await asyncio.wait_for(bob, 10)
        assert not lease.borrowed and len(lease.gpu_uuids) == 2
        assert pool.lease(newer.id).end_reason == "reclaimed" and not pool.reclaiming()
        assert pool.lease(older.id).ended_at is None  # within alice's share: never asked back

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_of_two_borrowed_leases_started_together_the_heavier_recent_user_is_asked_back(tmp_path):
    now = [T0 - timedelta(hours=10)]
    pool = make_pool(tmp_path, max_gpus_per_user=1, clock=lambda: now[0])

    async def main():
        past = pool.try_acquire("dave", "", 1)  # 9 GPU-hours of recent use: the lower priority
        now[0] = T0 - timedelta(hours=1)
        assert pool.release(past.id, EndReason.STOPPED)
        now[0] = T0
        dave = pool.try_acquire("dave", "job/1", 2, borrow=True)
        carol = pool.try_acquire("carol", "job/2", 2, borrow=True)  # the same moment, the newer row
        assert dave.borrowed and carol.borrowed and dave.started_at == carol.started_at
        bob = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=30))
        [asked] = await async_until(lambda: pool.reclaiming(HOST), 10, "a borrowed lease asked back")
        assert asked.id == dave.id and pool.lease(carol.id).reclaim_at is None
        await cancelled(bob)

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_borrower_never_asks_anything_back_and_waits_behind_requests_within_their_share(tmp_path):
    pool = make_pool(tmp_path, count=2, max_gpus_per_user=0)

    async def main():
        first = pool.try_acquire("alice", "job/1", 2, borrow=True)
        carol = asyncio.ensure_future(pool.acquire("carol", "job/2", 1, timeout=30, borrow=True))
        await async_until(lambda: pool.queue(), 10, "carol queued")
        assert pool.try_acquire("dee", "job/3", 1, borrow=True) is None  # a borrower does not pass another
        assert not pool.reclaiming() and [w.user for w in pool.queue()] == ["carol"]
        pool.release(first.id)
        lease = await asyncio.wait_for(carol, 10)
        assert lease.borrowed

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_version_12_ledger_gains_the_borrowing_columns_in_place(tmp_path):
    a_version_12_ledger_gains_the_borrowing_columns_in_place(f"sqlite:///{tmp_path / 'ledger.sqlite'}")


def a_version_12_ledger_gains_the_borrowing_columns_in_place(url: str) -> None:
    """The 12 -> 13 migration's ALTERs on the ledger at `url` (SQLite here; PostgreSQL in
    tests/integration/test_pool_borrow_postgres.py): rows from before read as within their share."""
    from spawner.inventory import SimulatedInventory
    from spawner.pool import SCHEMA_VERSION, GPUPool
    from spawner.pool.ledger.job_records import JobLedger

    def open_pool() -> GPUPool:
        return GPUPool(inventory=SimulatedInventory(count=4, host=HOST), db_url=url, max_gpus_per_user=1)

    pool = open_pool()
    kept = pool.try_acquire("alice", "", 1)
    job = JobLedger(pool).create("alice", [], "tf-cpu", ["true"], "", 60, HOST, 1000, 100)
    pool.close()
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for table, column in (("gpu_pool_leases", "borrowed"), ("gpu_pool_leases", "reclaim_at"),
                                  ("gpu_pool_waiters", "beyond"), ("gpu_pool_jobs", "borrow"),
                                  ("gpu_pool_jobs", "requeue"), ("gpu_pool_jobs", "attempts")):
                conn.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN {column}"))
            conn.execute(sa.text("UPDATE gpu_pool_meta SET value='12' WHERE key='schema_version'"))
        pool = open_pool()
        try:
            old = pool.lease(kept.id)
            assert old.ended_at is None and not old.borrowed and old.reclaim_at is None  # within its share
            before = JobLedger(pool).get(job.id)
            assert not before.borrow and before.requeue and before.attempts == 1
            lent = pool.try_acquire("alice", "job/1", 2, borrow=True)
            assert lent.borrowed and pool.lease(lent.id).borrowed
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT value FROM gpu_pool_meta WHERE key='schema_version'")).scalar() \
                    == str(SCHEMA_VERSION) == "14"
        finally:
            pool.close()
    finally:
        engine.dispose()


@pytest.mark.parametrize("order", ["fifo", "fairshare"])
def test_a_job_queued_again_keeps_its_place_by_its_first_submission(tmp_path, order):
    pool = make_pool(tmp_path, count=1, queue_order=order)

    async def main():
        holder = pool.try_acquire("zed", "", 1)
        bob = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=30))
        await async_until(lambda: pool.queue(), 10, "bob queued")
        again = asyncio.ensure_future(pool.acquire("alice", "job/1", 1, timeout=30,
                                                   since=datetime.now(UTC) - timedelta(hours=1)))
        await async_until(lambda: len(pool.queue()) == 2, 10, "alice's job queued again")
        assert [w.user for w in pool.queue()] == ["alice", "bob"]
        pool.release(holder.id)
        lease = await asyncio.wait_for(again, 10)
        assert lease.user == "alice" and not bob.done()
        await cancelled(bob)

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_the_pool_page_marks_borrowed_gpus(tmp_path):
    from spawner.poolpage import views

    pool = make_pool(tmp_path, max_gpus_per_user=1)
    try:
        lease = pool.try_acquire("alice", "job/1", 2, borrow=True)
        own = pool.try_acquire("alice", "", 1)
        rows = {r["lease_id"]: r for r in views.gpu_rows(pool.gpus(), views.Viewer("bob"))}
        assert rows[lease.id]["borrowed"] and rows[lease.id]["reclaim_at"] is None
        assert not rows[own.id]["borrowed"]
    finally:
        pool.close()


def test_a_borrowed_lease_on_its_holders_booking_is_never_asked_back(tmp_path):
    pool = make_pool(tmp_path, max_gpus_per_user=1, poll_interval=0.05)
    now = datetime.now(UTC)

    async def main():
        booking = pool.book("alice", 2, now, now + timedelta(hours=2), admin=True)
        other = pool.try_acquire("carol", "job/2", 2, borrow=True)  # the two unbooked GPUs, borrowed
        mine = pool.try_acquire("alice", "job/1", 2, borrow=True)  # beyond her share, on her booked GPUs
        assert mine.borrowed and set(mine.gpu_uuids) == set(booking.gpu_uuids) and other.borrowed
        bob = asyncio.ensure_future(pool.acquire("bob", "", 1, timeout=30))
        [asked] = await async_until(lambda: pool.reclaiming(), 10, "a borrowed lease asked back")
        assert asked.id == other.id  # carol's, though alice's started later: hers is on her booking
        pool.release(other.id, EndReason.RECLAIMED)
        assert (await asyncio.wait_for(bob, 10)).user == "bob"
        assert pool.lease(mine.id).reclaim_at is None and pool.lease(mine.id).ended_at is None

    try:
        asyncio.run(main())
    finally:
        pool.close()
