"""The browser channel of notifications outside the tab (issue 39): the feed an open pool page asks
(`GET api/notifications/feed`) on a real ledger, through the service's app on loopback: each event
once (one tab of several), a grant held until its server is ready, the user's own only, the
user's choices, and the bounds (page size, asks a minute, age).  Chromium showing the
notification: tests/integration/test_notify_browser.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
import requests

from spawner.notify import directory
from spawner.notify.settings import BrowserNotifications
from spawner.pool.ledger import outbox
from spawner.pool.ledger.job_records import JobLedger
from spawner.poolpage.handlers import notifications as handlers

from .test_notify import Clock, ReadyHub, make_pool, queued_grant, rows


def browser_rows(pool, user: str | None = None) -> list[dict]:
    return rows(pool, user, channels=(outbox.BROWSER,))


def user_from_header(self):
    name = self.request.headers.get("X-User")
    return {"name": name, "scopes": [], "kind": "user", "groups": []} if name else None


@pytest.fixture
def feed_service(tmp_path):
    """(the service's base URL, the pool, the hub's stand-in, a Clock): the ledger's clock is the test's."""
    from tests.fixtures.pool_app import serving_app

    def serve(**settings):
        clock = Clock()
        pool = make_pool(tmp_path, clock=clock)
        hub = ReadyHub(pool)
        stack.append(pool)
        cm = serving_app(pool, user_from_header, hub_api=hub, browser=BrowserNotifications(**settings))
        stack.append(cm)
        return cm.__enter__(), pool, hub, clock

    stack: list = []
    handlers._recent_polls.clear()
    yield serve
    for item in reversed(stack):
        if hasattr(item, "__exit__"):
            item.__exit__(None, None, None)
        else:
            item.close()


def ask(url: str, user: str) -> requests.Response:
    return requests.get(url + "api/notifications/feed", headers={"X-User": user}, timeout=10)


def end_jobs(pool, user: str, n: int) -> None:
    jobs = JobLedger(pool)
    for _ in range(n):
        job = jobs.create(user, [], "p", ["true"], ".", 60, "node-1", 1, 1)
        jobs.update(job.id, ("queued",), "ended_at", state="cancelled")


def test_the_feed_tells_a_queued_grant_once_its_server_is_ready_once_and_to_its_user_only(feed_service):
    url, pool, hub, clock = feed_service()
    hub.ready = False
    asyncio.run(queued_grant(pool))
    [row] = browser_rows(pool, "bob")
    assert (row["event"], row["state"]) == ("granted", "pending")
    r = ask(url, "bob")
    assert r.status_code == 200 and r.json()["events"] == [] and r.json()["poll_after_s"] == 5.0
    assert r.headers["Cache-Control"] == "no-store"
    assert browser_rows(pool, "bob")[0]["state"] == "pending"  # still starting: it waits
    assert ask(url, "alice").json()["events"] == []  # another user's page gets none of bob's
    hub.ready = True
    assert ask(url, "bob").json()["events"] == []  # looked at again after poll_interval, not at every ask
    clock.advance(5)
    [shown] = ask(url, "bob").json()["events"]
    assert shown["event"] == "granted"
    assert shown["title"] == "Your GPU is ready: your server train is running"
    assert "Waited in the queue" in shown["body"]
    assert shown["url"] == url.split("/services/")[0] + "/user/bob/train/"  # the page's own origin
    assert ask(url, "bob").json()["events"] == []  # at most once
    assert browser_rows(pool, "bob")[0]["state"] == "sent"
    assert rows(pool, "bob")[0]["state"] == "pending"  # the mail's row is the e-mail sender's


def test_two_tabs_asking_at_once_show_each_event_once(feed_service):
    url, pool, _, _ = feed_service()
    end_jobs(pool, "bob", 6)
    got: list[list[dict]] = []
    barrier = threading.Barrier(4)

    def tab():
        barrier.wait()
        got.append(ask(url, "bob").json()["events"])
    tabs = [threading.Thread(target=tab) for _ in range(4)]
    for t in tabs:
        t.start()
    for t in tabs:
        t.join(30)
    ids = [e["id"] for answer in got for e in answer]
    assert len(got) == 4 and sorted(ids) == sorted({r["id"] for r in browser_rows(pool)}) and len(ids) == 6


def test_the_feed_is_bounded_by_page_size_asks_a_minute_and_age(feed_service):
    url, pool, _, clock = feed_service(page_size=4, polls_per_minute=3, max_age=600)
    end_jobs(pool, "bob", 6)
    first = ask(url, "bob").json()["events"]
    assert len(first) == 4 and all(e["title"].startswith("Your job ") for e in first)
    assert len(ask(url, "bob").json()["events"]) == 2
    r = ask(url, "bob")
    assert r.json()["events"] == []
    r = ask(url, "bob")  # the 4th ask within a minute
    assert r.status_code == 429 and r.headers["Retry-After"] == "60"
    assert r.json()["message"] == "At most 3 asks for new notifications a minute; try again in a minute"
    assert ask(url, "carol").status_code == 200  # per user
    # News older than max_age is dropped, not shown to a page opened later.
    end_jobs(pool, "carol", 1)
    clock.advance(601)
    assert ask(url, "carol").json()["events"] == []
    assert [r["state"] for r in browser_rows(pool, "carol")] == ["expired"]


def test_the_users_choices_apply_and_auto_tells_a_short_job_in_the_browser(feed_service):
    url, pool, _, _ = feed_service()
    end_jobs(pool, "bob", 1)  # a short job: no mail by default ("auto"), but a notification
    assert [e["event"] for e in ask(url, "bob").json()["events"]] == ["job-ended"]
    directory.set_preferences(pool, "bob", '{"events": {"job-ended": {"browser": "never"}}}')
    end_jobs(pool, "bob", 1)
    assert ask(url, "bob").json()["events"] == []
    assert browser_rows(pool, "bob")[0]["state"] == "skipped"


def test_the_feed_needs_a_login_and_is_404_when_the_browser_channel_is_off(feed_service):
    url, pool, _, _ = feed_service(enabled=False)
    assert requests.get(url + "api/notifications/feed", timeout=10).status_code == 403
    r = ask(url, "bob")
    assert r.status_code == 404 and "BrowserNotifications.enabled" in r.json()["message"]
    assert requests.get(url + "api/notifications", headers={"X-User": "bob"},
                        timeout=10).json()["channels"]["browser"]["enabled"] is False


def test_the_pool_page_offers_browser_notifications_and_asks_its_feed():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from spawner.poolpage import views
    from spawner.poolpage.app import TEMPLATES

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True))
    viewer = views.Viewer("bob")
    common = dict(viewer=viewer, gpus=[], summary=views.summary([]), queue=[], active=[], history=[],
                  total_hours=0, audit=[], base_url="/", prefix="/services/gpu-pool/", xsrf="tok'en")
    html = env.get_template("page.html").render(browser_notifications=BrowserNotifications(poll_interval=7),
                                                **common)
    assert 'id="notify-enable"' in html and '"/services/gpu-pool/api/notifications/feed"' in html
    assert "const every = 7000;" in html and "new Notification(" in html
    assert 'const xsrf = "tok\\u0027en";' in html and '"X-XSRFToken": xsrf' in html  # escaped in the script
    off = env.get_template("page.html").render(browser_notifications=BrowserNotifications(enabled=False), **common)
    assert "notify-enable" not in off
