"""More events outside the tab (issue 39): borrowed GPUs asked back (`reclaimed`) are told to the
job's owner, with how long is left, on a real ledger, by mail (a real SMTP server on loopback) and
in the browser's feed, once per job (a cluster's workers together)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from devservices.waiting import async_until
from spawner.notify import directory
from spawner.notify.browser import BrowserFeed
from spawner.notify.settings import BrowserNotifications
from spawner.pool import EndReason
from spawner.pool.ledger import outbox

from .test_notify import AUTH_STATE, ReadyHub, SMTPServer, make_pool, rows, sender


def test_a_reclaim_of_borrowed_gpus_tells_the_jobs_owner_how_long_is_left_once(tmp_path):
    pool = make_pool(tmp_path, gpus=4, max_gpus_per_user=2, reclaim_grace=90)
    directory.record_address(pool, "bob", AUTH_STATE)  # bob@example.org

    async def main():
        pool.try_acquire("bob", "job/1", 1, borrow=True)  # within his share of 2: never asked back
        newer = pool.try_acquire("bob", "job/2", 3, borrow=True)  # beyond it: borrowed
        assert newer.borrowed and rows(pool) == []  # borrowing tells nothing
        carol = asyncio.ensure_future(pool.acquire("carol", "", 2, timeout=30))
        [asked] = await async_until(lambda: pool.reclaiming(), 10, "the borrowed lease asked back")
        [event] = rows(pool, "bob")
        assert event["event"] == "reclaimed"
        p = event["payload"]
        assert (p["job_id"], p["server_name"], p["gpus"], p["grace_s"]) == (2, "job/2", 3, 90.0)
        stops = datetime.fromisoformat(p["stops_at"])
        assert stops == datetime.fromisoformat(p["asked_at"]) + timedelta(seconds=90)
        assert rows(pool, "carol") == []  # the one who asked is not named nor told here
        with SMTPServer() as smtp:
            assert await sender(pool, smtp.port).run_once() == 1  # "auto": a reclaim is always told
            [(to, msg)] = smtp.inbox.messages
        assert to == ["bob@example.org"]
        assert msg["Subject"].startswith("GPU hub: Your job 2 runs on borrowed GPUs that are asked back: it stops in ")
        text = msg.get_body(("plain",)).get_content()
        assert "Stops at: " + stops.strftime("%H:%M:%S UTC") in text
        assert "https://hub.example.org/services/gpu-pool/jobs/2" in text
        feed = BrowserFeed(pool, BrowserNotifications())
        [shown] = await feed.take("bob", ReadyHub(pool), b"k" * 32, "http://127.0.0.1:8000", "/",
                                  "/services/gpu-pool/")
        assert shown["event"] == "reclaimed" and shown["url"] == "http://127.0.0.1:8000/services/gpu-pool/jobs/2"
        assert "Stops at" in shown["body"]
        pool.release(newer.id, EndReason.RECLAIMED)
        await asyncio.wait_for(carol, 10)
        assert [r["event"] for r in pool._store.read(lambda conn: outbox.entries(conn, "bob"))] == [
            "reclaimed", "reclaimed"]  # one per channel (e-mail, browser), never a second mark

    try:
        asyncio.run(main())
    finally:
        pool.close()


def test_a_gpu_hour_budget_at_80_and_100_percent_is_told_once_each_per_period(tmp_path):
    from spawner.notify import budget_watch
    from spawner.notify.sender import Sender

    from .test_notify import Clock, settings

    clock = Clock()
    pool = make_pool(tmp_path, gpus=2, clock=clock, gpu_hour_budget=1.0, budget_period=3600)
    directory.record_address(pool, "bob", AUTH_STATE)
    store = pool._store
    lease = pool.try_acquire("bob", "", 2)  # 2 GPUs: a GPU-hour every 30 min
    assert budget_watch.run_once(store) == 0  # nothing used yet
    clock.advance(23 * 60)  # 0.77 GPU-hours
    assert budget_watch.run_once(store) == 0
    clock.advance(2 * 60)  # 0.83
    assert budget_watch.run_once(store) == 1
    writes = []
    write = store.write
    store.write = lambda fn: writes.append(fn) or write(fn)
    assert budget_watch.run_once(store) == 0  # once per threshold
    assert writes == []  # what was told already takes no write lock at each round
    store.write = write
    [event] = rows(pool, "bob")
    assert (event["event"], event["payload"]["percent"], event["payload"]["who"]) == ("budget", 80, "you")
    assert event["payload"]["used"] == 0.833 and event["payload"]["limit"] == 1.0
    clock.advance(5 * 60)  # 1.0: used up
    assert budget_watch.run_once(store) == 1 and budget_watch.run_once(store) == 0
    assert [r["payload"]["percent"] for r in rows(pool, "bob")] == [100, 80]

    with SMTPServer() as smtp:
        s = Sender(pool, settings(smtp.port, mails_per_hour=10), "/services/gpu-pool/", "http://127.0.0.1:8000/",
                   hub=ReadyHub(pool))
        assert asyncio.run(s.run_once()) == 1  # "auto": budgets are told; both in one digest
        [(_, msg)] = smtp.inbox.messages
    text = msg.get_body(("plain",)).get_content()
    assert "Your GPU-hour budget is 80 % used (1 GPU-hours)" in text
    assert "Your GPU-hour budget (1 GPU-hours) is used up: GPU servers and jobs stop" in text
    assert "You have used 1.0 of your 1 GPU-hours in the last" in text
    pool.release(lease.id)
    # A period later, the same budget reaching 80 % again is told again.
    clock.advance(3600)
    lease = pool.try_acquire("bob", "", 2)
    clock.advance(25 * 60)
    assert budget_watch.run_once(store) == 1
    pool.release(lease.id)
    pool.close()


def test_no_budget_no_budget_events(tmp_path):
    from spawner.notify import budget_watch

    from .test_notify import Clock

    clock = Clock()
    pool = make_pool(tmp_path, gpus=2, clock=clock)
    pool.try_acquire("bob", "", 2)
    clock.advance(10 * 3600)
    assert budget_watch.run_once(pool._store) == 0 and rows(pool) == []
    pool.close()


def test_a_booking_tells_its_booker_soon_and_ready_and_the_holder_of_its_gpu_when_it_stops(tmp_path):
    from spawner.notify import booking_watch
    from spawner.notify.message import Links, describe

    from .test_notify import Clock

    clock = Clock()
    pool = make_pool(tmp_path, gpus=1, clock=clock)
    store = pool._store
    held = pool.try_acquire("alice", "train", 1)
    b = pool.book("bob", 1, clock.now + timedelta(minutes=20), clock.now + timedelta(minutes=80), admin=True)
    assert booking_watch.run_once(store) == 1 and booking_watch.run_once(store) == 0  # once
    [out] = rows(pool, "alice")
    assert out["event"] == "booked-out"
    assert (out["payload"]["booking_id"], out["payload"]["lease_id"], out["payload"]["server_name"]) == (
        b.id, held.id, "train")
    assert out["payload"]["stops_at"] == b.starts_at.isoformat() and rows(pool, "bob") == []
    links = Links("https://hub.example.org/", "https://hub.example.org/services/gpu-pool/", {})
    entry = outbox.Entry(out["id"], "alice", out["event"], "email", out["payload"], out["created_at"], 1)
    title, facts, _ = describe(entry, links)
    assert title.startswith("Your server train stops in ") and "booked by someone else" in title
    assert dict(facts)["Stops at"] == b.starts_at.strftime("%a %H:%M UTC")

    clock.advance(6 * 60)  # 14 minutes before the start
    assert booking_watch.run_once(store) == 1 and booking_watch.run_once(store) == 0
    [soon] = rows(pool, "bob")
    assert (soon["event"], soon["payload"]["kind"], soon["payload"]["gpus"]) == ("booking", "soon", 1)
    clock.advance(15 * 60)  # started; alice's server still holds the GPU: not ready yet
    assert booking_watch.run_once(store) == 0
    pool.release(held.id, EndReason.BOOKING)
    assert booking_watch.run_once(store) == 1 and booking_watch.run_once(store) == 0
    assert ([(r["event"], r["payload"]["kind"]) for r in rows(pool, "bob")]
            == [("booking", "ready"), ("booking", "soon")])
    assert len(rows(pool, "alice")) == 1
    told = [describe(outbox.Entry(r["id"], "bob", r["event"], "email", r["payload"], r["created_at"], 1), links)
            for r in rows(pool, "bob")]
    assert told[1][0] == "Your booking of 1 GPU(s) starts in 0 s"  # (the test's clock is in the past)
    assert told[0][0].startswith("Your booked GPUs are ready: 1 GPU(s) of node-1, until ")
    assert told[0][2] == "https://hub.example.org/hub/spawn"
    pool.close()
