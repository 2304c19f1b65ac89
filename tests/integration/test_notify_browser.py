"""Browser notifications in real Chromium (issue 39): a user queued behind a full pool, with the GPU
pool page open (in a background tab, as it were) and notifications allowed, is shown "Your GPU is
ready" by the browser once the hub says their server is ready.

Chromium's permission is granted through CDP (`Browser.grantPermissions`), as a person's click on
"Allow" would; the page's `window.Notification` is wrapped before any of its scripts runs
(`Page.addScriptToEvaluateOnNewDocument`), so the test sees each notification the page shows
(headless Chromium draws none)."""

from __future__ import annotations

from ..fixtures.hub import DUMMY_PASSWORD, wait_for
from .test_browser import by_css, log_in, text_of
from .test_notifications import ReadyWatch
from .test_poolpage import wait_for_page

# Each notification the page makes, recorded (then made for real where the browser can).
RECORD_NOTIFICATIONS = """
(function () {
  const Real = window.Notification;
  if (!Real) { return; }
  window.shownNotifications = [];
  function Recorded(title, options) {
    window.shownNotifications.push({title: title, body: (options || {}).body || "", at: Date.now()});
    return new Real(title, options);
  }
  Recorded.requestPermission = function () { return Real.requestPermission.apply(Real, arguments); };
  Object.defineProperty(Recorded, "permission", {get: function () { return Real.permission; }});
  window.Notification = Recorded;
})();
"""


def shown(browser) -> list[dict]:
    return browser.driver.execute_script("return window.shownNotifications || []")


def test_chromium_shows_the_ready_notification_when_a_queued_spawn_is_served(make_hub, browser, capsys):
    hub = make_hub()
    for user in ("eve", "fay", "gus"):
        hub.create_user(user)
    wait_for_page(hub, hub.user_token("gus"))
    hub.start_server("fay", {"profile": "tf-gpu-2"})
    hub.start_server("eve", {"profile": "tf-gpu-2"})  # the pool (4 GPUs) is full

    gus = browser("gus")
    driver = gus.driver
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_NOTIFICATIONS})
    log_in(gus, hub, "gus", DUMMY_PASSWORD)
    driver.execute_cdp_cmd("Browser.grantPermissions", {"origin": hub.url, "permissions": ["notifications"]})
    driver.get(f"{hub.url}/services/gpu-pool/")
    gus.wait(lambda d: d.find_elements(*by_css("#gpus")), 60, "the pool page did not open")
    gus.wait(lambda d: "Notifications on" in text_of(gus, "#notify-state"), 30,
             "the pool page did not turn its browser notifications on")

    r = hub.api("POST", "/users/gus/server", json={"profile": "tf-gpu-1"})
    assert r.status_code == 202, r.text  # queued
    wait_for(lambda: hub.ledger().queue(), timeout=30, what="gus in the queue", hub=hub)
    asked = driver.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('notifications/feed')).length")
    assert asked >= 1 and shown(gus) == []  # the page asks; nothing to tell while gus waits
    gus.shot("1-queued")

    with ReadyWatch(hub, "gus") as ready:
        hub.stop_server("eve")  # the grant
        [told] = gus.wait(lambda d: shown(gus), 90, "no notification after the grant")
        wait_for(lambda: ready.at is not None, timeout=10, what="the hub's model saying ready", hub=hub)
    assert told["title"] == "Your GPU is ready: your server (default) is running", told
    assert "Waited in the queue" in told["body"]
    gus.shot("2-notified")
    # Told once: later asks show nothing more.
    asks = driver.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('notifications/feed')).length")
    gus.wait(lambda d: d.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('notifications/feed')).length")
        > asks + 1, 30, "the page stopped asking")
    assert len(shown(gus)) == 1
    assert ready.at is not None
    latency = told["at"] / 1000 - ready.at
    with capsys.disabled():
        print(f"\nready (as the hub's model first said, polled every 0.1 s) -> browser notification: "
              f"{latency:.2f} s (the page asks every 5 s)")
